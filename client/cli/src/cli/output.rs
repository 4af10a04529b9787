//! Writing to stdout: lines, JSON objects and aligned tables; and the
//! one-line form of an error for stderr.
//!
//! Every write returns its `io::Error` instead of panicking as `println!`
//! does, so a closed pipe (`tally watch KEY | head -1`) ends the command
//! quietly ([`is_broken_pipe`]).

use std::fmt::Display;
use std::io::{self, Write};

use serde::Serialize;

/// Writes `line` and a newline to stdout.
pub fn print_line(line: impl Display) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()
}

/// Writes `value` as one line of compact JSON.
pub fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    print_line(serde_json::to_string(value)?)?;
    Ok(())
}

/// How a table column lines up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Text: flush left.
    Left,
    /// Numbers: flush right.
    Right,
}

/// Renders a table: the header, then one line per row, columns padded to
/// their widest cell and separated by two spaces; no trailing spaces.
pub fn render_table(columns: &[(&str, Align)], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = columns.iter().map(|(name, _)| name.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header: Vec<String> = columns.iter().map(|(name, _)| (*name).to_owned()).collect();
    let mut table = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (index, ((cell, width), (_, align))) in row.iter().zip(&widths).zip(columns).enumerate()
        {
            if index > 0 {
                line.push_str("  ");
            }
            let padding = width.saturating_sub(cell.chars().count());
            match align {
                Align::Left => {
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', padding));
                }
                Align::Right => {
                    line.extend(std::iter::repeat_n(' ', padding));
                    line.push_str(cell);
                }
            }
        }
        table.push_str(line.trim_end());
        table.push('\n');
    }
    table
}

/// The error and its causes on one line ("a: b: c"), for `error: ...`.
pub fn one_line(error: &anyhow::Error) -> String {
    let text = format!("{error:#}");
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// True when the error is a write to a closed pipe.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_trim_line_ends() {
        let table = render_table(
            &[
                ("REGION", Align::Left),
                ("VALUE", Align::Right),
                ("LAST SYNC", Align::Left),
            ],
            &[
                vec!["eu-west".into(), "20000".into(), "local".into()],
                vec!["us".into(), "-5".into(), "1.2s".into()],
            ],
        );
        assert_eq!(
            table,
            "REGION   VALUE  LAST SYNC\n\
             eu-west  20000  local\n\
             us          -5  1.2s\n"
        );
    }

    #[test]
    fn errors_print_on_one_line_with_their_causes() {
        let error = anyhow::anyhow!("connection refused\n(os error 111)").context("cannot add");
        assert_eq!(
            one_line(&error),
            "cannot add: connection refused (os error 111)"
        );
    }

    #[test]
    fn a_broken_pipe_is_recognised_through_context() {
        let error =
            anyhow::Error::from(io::Error::from(io::ErrorKind::BrokenPipe)).context("watch");
        assert!(is_broken_pipe(&error));
        assert!(!is_broken_pipe(&anyhow::anyhow!("other")));
    }
}
