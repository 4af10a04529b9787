//! The configuration reference, rendered from the node's own settings: every
//! flag of [`RunArgs`] with its environment variable, its key in the
//! `--config` file, its default and its help text, as the Markdown page
//! `docs/src/reference/configuration.md` (`tally-node config-reference`
//! prints it).
//!
//! Invariant: the page says nothing the code does not. A setting without
//! help text, without a `[default: ...]` in that text, without an
//! environment variable, or whose config-file key the file does not accept,
//! makes [`render`] fail instead of printing a row that would mislead; and a
//! test fails when the checked-in page differs from what [`render`] prints.

use clap::Args as _;

use crate::config::RunArgs;

/// The page's path in the repository, and the command that rewrites it.
pub const PAGE: &str = "docs/src/reference/configuration.md";
/// How to regenerate [`PAGE`] after changing a setting.
pub const REGENERATE: &str =
    "cargo run -p tally-node -- config-reference > docs/src/reference/configuration.md";

/// The section of settings that carry no `help_heading`.
const FIRST_SECTION: &str = "The node";

/// Why a setting cannot be documented as it is.
#[derive(Debug, thiserror::Error)]
#[error("the configuration reference cannot be rendered; fix these settings in node/src/config.rs:\n{}", problems.join("\n"))]
pub struct Undocumented {
    /// One line per setting and what it lacks.
    pub problems: Vec<String>,
}

/// The reference page for `tally-node`'s settings, as Markdown.
pub fn render() -> Result<String, Undocumented> {
    let command = RunArgs::augment_args(clap::Command::new("tally-node"));
    render_command(&command, crate::config::file_keys())
}

/// One documented setting.
struct Row {
    flag: String,
    env: String,
    file_key: String,
    default: String,
    help: String,
}

/// Renders the settings of `command` (hidden ones left out: they are for
/// tests); `file_keys` are the keys the `--config` file accepts.
fn render_command(command: &clap::Command, file_keys: &[&str]) -> Result<String, Undocumented> {
    let mut problems = Vec::new();
    let mut sections: Vec<(String, Vec<Row>)> = Vec::new();
    // Every visible flag's key, whatever else it lacks (its own problem is
    // reported once, not again as a key without a flag).
    let flag_keys: Vec<String> = command
        .get_arguments()
        .filter(|arg| !arg.is_hide_set())
        .filter_map(|arg| arg.get_long())
        .map(|long| long.replace('-', "_"))
        .collect();
    for arg in command.get_arguments() {
        if arg.is_hide_set() {
            continue;
        }
        let Some(long) = arg.get_long() else {
            continue;
        };
        let flag = format!("--{long}");
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|help| help.to_string())
            .unwrap_or_default();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        if help.is_empty() {
            problems.push(format!("{flag}: no help text (write a /// doc comment)"));
            continue;
        }
        let env = match arg.get_env() {
            Some(env) => env.to_string_lossy().into_owned(),
            None => {
                problems.push(format!(
                    "{flag}: no environment variable (add env = \"TALLY_...\")"
                ));
                continue;
            }
        };
        let file_key = long.replace('-', "_");
        // `--config` names the file: it is no key of it.
        let file_key = if long == "config" {
            "(none)".to_owned()
        } else if file_keys.contains(&file_key.as_str()) {
            format!("`{file_key}`")
        } else {
            problems.push(format!(
                "{flag}: the config file has no key {file_key} (add it to FileSettings)"
            ));
            continue;
        };
        let (text, default) = match split_default(&help) {
            Some(split) => split,
            None => {
                problems.push(format!(
                    "{flag}: its help text ends with no [default: ...] (write [default: none] when there is none)"
                ));
                continue;
            }
        };
        let mut help = text.to_owned();
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|value| !value.is_hide_set())
            .map(|value| format!("`{}`", value.get_name()))
            .collect();
        // A switch (`--secure`) lists true and false; its help says what it does.
        if !values.is_empty() && values != ["`true`", "`false`"] {
            help.push_str(&format!(" One of {}.", values.join(", ")));
        }
        let heading = arg.get_help_heading().unwrap_or(FIRST_SECTION).to_owned();
        let row = Row {
            flag: format!("`{flag}`"),
            env: format!("`{env}`"),
            file_key,
            default: code_if_plain(default),
            help,
        };
        match sections.iter_mut().find(|(name, _)| *name == heading) {
            Some((_, rows)) => rows.push(row),
            None => sections.push((heading, vec![row])),
        }
    }
    for key in file_keys {
        if !flag_keys.iter().any(|flag_key| flag_key == key) {
            problems.push(format!(
                "config file key {key}: no visible flag --{} (every key is a flag too)",
                key.replace('_', "-")
            ));
        }
    }
    if !problems.is_empty() {
        return Err(Undocumented { problems });
    }
    Ok(page(&sections))
}

/// Splits `help text. [default: X]` into the text and `X`.
fn split_default(help: &str) -> Option<(&str, &str)> {
    let start = help.rfind("[default: ")?;
    let rest = help[start + "[default: ".len()..].strip_suffix(']')?;
    Some((help[..start].trim_end(), rest.trim()))
}

/// A default written as a value (`200ms`, `tally-data`) goes in code quotes;
/// one written in words ("the rate", "none") stays prose.
fn code_if_plain(default: &str) -> String {
    let value = default.split(',').next().unwrap_or(default).trim();
    let prose = ["none", "unset", "off", "the ", "gossip ", "plain ", "5%"];
    if prose.iter().any(|word| value.starts_with(word)) {
        default.to_owned()
    } else if let Some((value, rest)) = default.split_once(", ") {
        format!("`{value}` ({rest})")
    } else {
        format!("`{default}`")
    }
}

/// The whole page: a header that says where it comes from, then one table
/// per section.
fn page(sections: &[(String, Vec<Row>)]) -> String {
    let mut out = String::new();
    out.push_str("# Every setting of tally-node\n\n");
    out.push_str(&format!(
        "<!-- Generated from node/src/config.rs by `tally-node config-reference`: do not edit.\n     Regenerate with: {REGENERATE} -->\n\n"
    ));
    out.push_str(
        "Each setting is a flag, an environment variable and a key of the `--config` \
         file; flags win over the environment, which wins over the file \
         ([Configuration](../configuration.md) says more). `tally-node --help` \
         shows the same text.\n",
    );
    for (name, rows) in sections {
        out.push_str(&format!(
            "\n## {name}\n\n| flag | env | config file | default | meaning |\n|---|---|---|---|---|\n"
        ));
        for row in rows {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                row.flag,
                row.env,
                row.file_key,
                row.default,
                row.help.replace('|', "\\|")
            ));
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Fails, saying how to regenerate it, when the checked-in `page` (a
    /// path in the repository) is not `rendered` from `source`. The gRPC
    /// reference's test uses it too.
    #[track_caller]
    pub(crate) fn assert_checked_in(page: &str, rendered: &str, source: &str, regenerate: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(page);
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            checked_in == rendered,
            "{page} differs from {source}; regenerate it from the repository root with:\n    {regenerate}"
        );
    }

    #[test]
    fn the_checked_in_page_is_what_the_code_renders() {
        let rendered = render().unwrap_or_else(|error| panic!("{error}"));
        assert_checked_in(
            PAGE,
            &rendered,
            "the settings in node/src/config.rs",
            REGENERATE,
        );
    }

    #[test]
    fn every_visible_setting_is_on_the_page() {
        let page = render().expect("renders");
        let command = RunArgs::augment_args(clap::Command::new("tally-node"));
        for arg in command.get_arguments().filter(|arg| !arg.is_hide_set()) {
            let flag = format!(
                "| `--{}` |",
                arg.get_long().expect("every setting is a long flag")
            );
            assert!(page.contains(&flag), "{flag} is missing from the page");
        }
        for key in crate::config::file_keys() {
            assert!(
                page.contains(&format!("| `{key}` |")),
                "file key {key} is missing"
            );
        }
    }

    #[track_caller]
    fn problems_of(command: clap::Command, file_keys: &[&str]) -> Vec<String> {
        match render_command(&command, file_keys) {
            Ok(page) => panic!("rendered although a setting is undocumented:\n{page}"),
            Err(undocumented) => undocumented.problems,
        }
    }

    #[test]
    fn a_flag_without_help_text_is_refused() {
        let command = clap::Command::new("t").arg(
            clap::Arg::new("new_thing")
                .long("new-thing")
                .env("TALLY_NEW_THING"),
        );
        let problems = problems_of(command, &["new_thing"]);
        assert_eq!(
            problems,
            ["--new-thing: no help text (write a /// doc comment)"]
        );
    }

    #[test]
    fn a_flag_without_default_env_or_file_key_is_refused() {
        let command = clap::Command::new("t")
            .arg(clap::Arg::new("a").long("a").env("TALLY_A").help("Does a."))
            .arg(clap::Arg::new("b").long("b").help("Does b. [default: 1]"))
            .arg(
                clap::Arg::new("c")
                    .long("c")
                    .env("TALLY_C")
                    .help("Does c. [default: 1]"),
            );
        let problems = problems_of(command, &["a", "b", "d"]);
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].starts_with("--a: its help text ends with no [default"));
        assert!(problems[1].starts_with("--b: no environment variable"));
        assert!(problems[2].starts_with("--c: the config file has no key c"));
        assert!(problems[3].starts_with("config file key d: no visible flag"));
    }

    #[test]
    fn defaults_in_words_stay_prose_and_values_are_code() {
        assert_eq!(
            split_default("Does x. [default: 5m]"),
            Some(("Does x.", "5m"))
        );
        assert_eq!(code_if_plain("5m"), "`5m`");
        assert_eq!(code_if_plain("none"), "none");
        assert_eq!(code_if_plain("134217728, 128 MiB"), "`134217728` (128 MiB)");
    }
}
