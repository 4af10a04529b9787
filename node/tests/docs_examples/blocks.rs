//! The shell examples of the documentation, as the docs-examples test reads
//! them: every fenced block whose language is a shell (`sh`, `bash`,
//! `shell`, `console`), with the marker that says whether a test runs it.
//!
//! A runnable example is marked by an HTML comment on the line right above
//! its fence, invisible on GitHub and in the book:
//!
//! - `<!-- doc-test -->`: run it to the end; it must exit 0.
//! - `<!-- doc-test: background -->`: it runs until stopped (a watch, an
//!   event stream): start it, wait for its first line of output, and stop it
//!   when the page is done.
//!
//! The output an example shows is a ```` ```text ```` block right below a
//! `<!-- doc-test -->` block (blank lines may part them): what the reader
//! sees is what the test checks. The example's standard output must match
//! it line by line, from the first line to the last, trailing spaces
//! aside, where
//!
//! - `...` inside a line stands for any text (a digest, a time), and
//! - a line that is only `...` stands for any number of lines (those the
//!   page leaves out).
//!
//! So a page shows the lines that matter and says where it leaves some out.
//!
//! Invariant: a marker that is not followed by a shell block, or that says
//! anything else, is an error, so a typo cannot turn an example off quietly;
//! and an example's shown output that it does not print fails the test.

use std::path::Path;

/// How the test runs a marked block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Run {
    /// To the end; it must exit 0.
    ToTheEnd,
    /// Until its first line of output, then in the background until the
    /// page is done.
    Background,
    /// Not at all: the block has no marker (a host-only command, a synopsis
    /// with placeholders, the cluster the test starts itself).
    Skipped,
}

/// One shell block of a page.
#[derive(Debug)]
pub struct Block {
    /// `README.md:31`: the page and the line of the opening fence.
    pub place: String,
    /// The commands, as a reader copies them.
    pub script: String,
    /// Whether and how it runs.
    pub run: Run,
    /// The output the page shows below it (a ```` ```text ```` block), which
    /// the example must print ([`output_matches`]); only for [`Run::ToTheEnd`].
    pub output: Option<String>,
}

const SHELLS: [&str; 4] = ["sh", "bash", "shell", "console"];

/// The shell blocks of `text` (the page `name`), or the first misplaced or
/// unknown marker.
pub fn shell_blocks(name: &str, text: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut index = 0;
    while index < lines.len() {
        let line = lines[index].trim();
        if let Some(marker) = line
            .strip_prefix("<!-- doc-test")
            .and_then(|rest| rest.strip_suffix("-->"))
        {
            let run = match marker.trim() {
                "" => Run::ToTheEnd,
                ": background" => Run::Background,
                other => {
                    return Err(format!(
                        "{name}:{}: unknown doc-test marker {other:?}",
                        index + 1
                    ))
                }
            };
            let fence = lines.get(index + 1).map(|l| l.trim()).unwrap_or_default();
            if !fence_language(fence).is_some_and(|language| SHELLS.contains(&language)) {
                return Err(format!(
                    "{name}:{}: a doc-test marker must be right above a ```sh block",
                    index + 1
                ));
            }
            let (mut block, mut next) = read_block(name, &lines, index + 1, run)?;
            let below = (next..lines.len()).find(|&at| !lines[at].trim().is_empty());
            if let Some(open) = below.filter(|&at| fence_language(lines[at].trim()) == Some("text"))
            {
                if run != Run::ToTheEnd {
                    return Err(format!(
                        "{name}:{}: a background example's output cannot be checked; \
                         leave out the ```text block or run it to the end",
                        open + 1
                    ));
                }
                let (shown, after) = read_block(name, &lines, open, Run::Skipped)?;
                block.output = Some(shown.script);
                next = after;
            }
            blocks.push(block);
            index = next;
            continue;
        }
        match fence_language(line) {
            Some(language) if SHELLS.contains(&language) => {
                let (block, next) = read_block(name, &lines, index, Run::Skipped)?;
                blocks.push(block);
                index = next;
            }
            Some(_) => index = skip_block(&lines, index),
            None => index += 1,
        }
    }
    Ok(blocks)
}

/// The language of an opening fence (```` ```sh ```` is `sh`, a bare fence
/// is ``""``), or `None` when `line` opens no block.
fn fence_language(line: &str) -> Option<&str> {
    let info = line.strip_prefix("```")?;
    Some(info.split([',', ' ']).next().unwrap_or_default())
}

/// The block that opens at `lines[open]`, and the index after its closing fence.
fn read_block(name: &str, lines: &[&str], open: usize, run: Run) -> Result<(Block, usize), String> {
    let close = (open + 1..lines.len())
        .find(|&at| lines[at].trim() == "```")
        .ok_or_else(|| format!("{name}:{}: a code block that never closes", open + 1))?;
    let script = lines[open + 1..close].join("\n");
    let block = Block {
        place: format!("{name}:{}", open + 1),
        script,
        run,
        output: None,
    };
    Ok((block, close + 1))
}

/// The index after the block (of any language) that opens at `lines[open]`.
fn skip_block(lines: &[&str], open: usize) -> usize {
    (open + 1..lines.len())
        .find(|&at| lines[at].trim().starts_with("```"))
        .map_or(lines.len(), |close| close + 1)
}

/// Whether `actual` (an example's standard output) matches `shown` (the
/// output its page shows): line by line, where `...` inside a line stands
/// for any text and a line of only `...` for any number of lines.
pub fn output_matches(shown: &str, actual: &str) -> bool {
    let shown: Vec<&str> = shown.lines().map(str::trim_end).collect();
    let actual: Vec<&str> = actual.lines().map(str::trim_end).collect();
    lines_match(&shown, &actual)
}

fn lines_match(shown: &[&str], actual: &[&str]) -> bool {
    match shown.split_first() {
        None => actual.is_empty(),
        Some((&"...", rest)) => (0..=actual.len()).any(|skip| lines_match(rest, &actual[skip..])),
        Some((line, rest)) => {
            actual
                .first()
                .is_some_and(|first| line_matches(line, first))
                && lines_match(rest, &actual[1..])
        }
    }
}

/// One line against a shown line whose `...`s stand for any text.
fn line_matches(shown: &str, actual: &str) -> bool {
    let mut parts = shown.split("...");
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = actual.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The pages whose examples the test reads: README.md first, then every
/// page of the book, in path order.
pub fn pages(root: &Path) -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                out.push(path);
            }
        }
    }
    let mut pages = vec![root.join("README.md")];
    walk(&root.join("docs/src"), &mut pages);
    pages
}

#[test]
fn markers_pick_blocks_and_a_stray_marker_is_an_error() {
    let page = "text\n<!-- doc-test -->\n```sh\ntally add k\n```\n\n```sh\nkubectl apply\n```\n\
                ```toml\nkey = 1\n```\n<!-- doc-test: background -->\n```sh\ntally watch k\n```\n";
    let blocks = shell_blocks("page.md", page).unwrap();
    let runs: Vec<Run> = blocks.iter().map(|block| block.run).collect();
    assert_eq!(runs, [Run::ToTheEnd, Run::Skipped, Run::Background]);
    assert_eq!(blocks[0].script, "tally add k");
    assert_eq!(blocks[0].place, "page.md:3");
    let stray = shell_blocks("page.md", "<!-- doc-test -->\n\n```sh\nx\n```\n").unwrap_err();
    assert!(stray.contains("right above"), "{stray}");
    let typo =
        shell_blocks("page.md", "<!-- doc-test: backgroud -->\n```sh\nx\n```\n").unwrap_err();
    assert!(typo.contains("unknown doc-test marker"), "{typo}");
}

#[test]
fn a_text_block_below_an_example_is_the_output_it_must_print() {
    let page = "<!-- doc-test -->\n```sh\ntally add k\n```\n\n```text\n1\n```\n\
                <!-- doc-test -->\n```sh\ntally get k\n```\nprose\n```text\nnot its output\n```\n";
    let blocks = shell_blocks("page.md", page).unwrap();
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0].output.as_deref(), Some("1"));
    assert_eq!(
        blocks[1].output, None,
        "prose parts a block from the text below it"
    );
    let background = "<!-- doc-test: background -->\n```sh\ntally watch k\n```\n```text\n1\n```\n";
    let refused = shell_blocks("page.md", background).unwrap_err();
    assert!(refused.contains("background"), "{refused}");
}

#[test]
fn shown_output_matches_line_by_line_with_ellipses() {
    let status =
        "cluster: dev\nmember eu 1a2b\nmember us 3c4d\nconverged: yes (all 3 live members)\n";
    assert!(output_matches(
        "cluster: dev\n...\nconverged: yes (...)",
        status
    ));
    assert!(output_matches("...\nconverged: yes ...", status));
    assert!(output_matches(
        "cluster: ...\nmember eu ...\nmember us ...\nconverged: ...",
        status
    ));
    // A wrong value, a missing line or lines left out without `...` fail.
    assert!(!output_matches("...\nconverged: no ...", status));
    assert!(!output_matches(
        "cluster: dev\nconverged: yes (...)",
        status
    ));
    assert!(!output_matches("cluster: dev", status));
    assert!(!output_matches("1", "12"));
    assert!(output_matches("liked; 1 likes\n", "liked; 1 likes  \n"));
    assert!(
        !output_matches("a...a", "a"),
        "the two ends may not overlap"
    );
}
