//! The gRPC API reference, rendered from the protos themselves: every
//! service, RPC, message, field, enum and enum value of
//! `proto/tally/v1/*.proto` with its comment, as the Markdown page
//! `docs/src/reference/grpc.md` (`tally-node grpc-reference` prints it).
//! It reads the descriptor set the node serves for reflection
//! ([`tally_proto::FILE_DESCRIPTOR_SET`]), which protox compiles with the
//! files' comments (`source_code_info`).
//!
//! Invariant: the page says nothing the protos do not, and leaves nothing
//! of them out. An element without a comment, or a shape the page cannot
//! show (a nested message or enum), makes [`render`] fail instead of
//! printing a bare row; and a test fails when the checked-in page differs
//! from what [`render`] prints.

use std::collections::HashMap;

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::source_code_info::Location;
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet};

/// The page's path in the repository.
pub const PAGE: &str = "docs/src/reference/grpc.md";
/// How to regenerate [`PAGE`] after changing a .proto file.
pub const REGENERATE: &str =
    "cargo run -p tally-node -- grpc-reference > docs/src/reference/grpc.md";

/// Why the protos cannot be documented as they are.
#[derive(Debug, thiserror::Error)]
#[error("the gRPC reference cannot be rendered; fix these in proto/tally/v1/:\n{}", problems.join("\n"))]
pub struct Undocumented {
    /// One line per element and what it lacks.
    pub problems: Vec<String>,
}

/// The reference page of Tally's gRPC API, as Markdown.
pub fn render() -> Result<String, Undocumented> {
    let set = FileDescriptorSet::decode(tally_proto::FILE_DESCRIPTOR_SET)
        .expect("tally-proto's descriptor set decodes");
    render_files(&set.file)
}

/// The comments of one file, by source path (`[4, 0, 2, 1]`: message 0,
/// field 1).
struct Comments<'a> {
    file: &'a str,
    by_path: HashMap<&'a [i32], &'a Location>,
}

// Field numbers of descriptor.proto, the steps of a source path.
const FILE_MESSAGE: i32 = 4;
const FILE_ENUM: i32 = 5;
const FILE_SERVICE: i32 = 6;
const FILE_SYNTAX: i32 = 12;
const CHILD: i32 = 2; // a message's field, an enum's value, a service's method

impl<'a> Comments<'a> {
    fn of(file: &'a FileDescriptorProto) -> Self {
        let locations = file.source_code_info.as_ref().map(|info| &info.location);
        Comments {
            file: file.name(),
            by_path: locations
                .into_iter()
                .flatten()
                .map(|location| (location.path.as_slice(), location))
                .collect(),
        }
    }

    /// The comment of the element at `path` (leading, else trailing), as
    /// paragraphs; a problem naming `what` when it has none.
    fn of_element(&self, path: &[i32], what: &str, problems: &mut Vec<String>) -> Vec<String> {
        let location = self.by_path.get(path);
        let text = location
            .and_then(|location| location.leading_comments.as_deref())
            .or_else(|| location.and_then(|location| location.trailing_comments.as_deref()))
            .unwrap_or_default();
        let paragraphs = paragraphs(text);
        if paragraphs.is_empty() {
            problems.push(format!("{}: {what} has no comment", self.file));
        }
        paragraphs
    }

    /// The comment of child `number` (a field, an enum value, a method) of
    /// the element at `parent`, as one table cell.
    fn of_child(
        &self,
        parent: &[i32],
        number: usize,
        what: &str,
        problems: &mut Vec<String>,
    ) -> String {
        let path = [parent, &[CHILD, number as i32]].concat();
        cell(&self.of_element(&path, what, problems))
    }

    /// The file's header: the comments above its `syntax` line (attached
    /// to it or apart from it by a blank line).
    fn header(&self, problems: &mut Vec<String>) -> Vec<String> {
        let text = self
            .by_path
            .get([FILE_SYNTAX].as_slice())
            .map(|location| {
                let mut parts = location.leading_detached_comments.clone();
                parts.extend(location.leading_comments.clone());
                parts.join("\n\n")
            })
            .unwrap_or_default();
        let paragraphs = paragraphs(&text);
        if paragraphs.is_empty() {
            problems.push(format!("{}: no comment above `syntax`", self.file));
        }
        paragraphs
    }
}

/// A heading (`###`), the element's comment and the head of its table
/// (none when empty).
fn open_section(out: &mut String, heading: &str, about: &[String], table_head: &str) {
    out.push_str(&format!("### {heading}\n\n"));
    for paragraph in about {
        out.push_str(&format!("{paragraph}\n\n"));
    }
    if !table_head.is_empty() {
        out.push_str(table_head);
        out.push('\n');
    }
}

/// A comment's paragraphs (blank lines part them), each on one line.
fn paragraphs(comment: &str) -> Vec<String> {
    comment
        .split("\n\n")
        .map(|paragraph| paragraph.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|paragraph| !paragraph.is_empty())
        .collect()
}

/// Text for a table cell: one line, no column breaks, no stray HTML.
fn cell(paragraphs: &[String]) -> String {
    paragraphs
        .join(" ")
        .replace('|', "\\|")
        .replace('<', "&lt;")
}

/// A link to a message or enum of the package (`.tally.v1.AddResponse`).
fn type_link(type_name: &str) -> String {
    let name = type_name.rsplit('.').next().unwrap_or(type_name);
    format!("[`{name}`](#{})", name.to_lowercase())
}

fn render_files(files: &[FileDescriptorProto]) -> Result<String, Undocumented> {
    let mut problems = Vec::new();
    let mut out = String::from("# The gRPC API, every message\n\n");
    out.push_str(&format!(
        "<!-- Generated from proto/tally/v1/*.proto by `tally-node grpc-reference`: do not edit.\n     Regenerate with: {REGENERATE} -->\n\n"
    ));
    out.push_str(
        "Every service, RPC, message, field and enum of the package `tally.v1`, with \
         the comments of its `.proto` files (in `proto/tally/v1/`). \
         [The gRPC API](../api/grpc.md) is the guide: ports, reflection, tokens, \
         status codes and examples.\n",
    );
    for file in files {
        let comments = Comments::of(file);
        out.push_str(&format!("\n## `{}`\n\n", file.name()));
        for paragraph in comments.header(&mut problems) {
            out.push_str(&format!("{paragraph}\n\n"));
        }
        for (index, service) in file.service.iter().enumerate() {
            let path = [FILE_SERVICE, index as i32];
            let name = service.name();
            let about = comments.of_element(&path, &format!("service {name}"), &mut problems);
            let head = "| RPC | request | answer | what it does |\n|---|---|---|---|";
            open_section(
                &mut out,
                &format!("Service `tally.v1.{name}`"),
                &about,
                head,
            );
            for (number, method) in service.method.iter().enumerate() {
                let what = format!("rpc {name}.{}", method.name());
                let text = comments.of_child(&path, number, &what, &mut problems);
                let stream = |streaming: bool| if streaming { "stream " } else { "" };
                out.push_str(&format!(
                    "| `{}` | {}{} | {}{} | {text} |\n",
                    method.name(),
                    stream(method.client_streaming()),
                    type_link(method.input_type()),
                    stream(method.server_streaming()),
                    type_link(method.output_type()),
                ));
            }
            out.push('\n');
        }
        for (index, message) in file.message_type.iter().enumerate() {
            render_message(&mut out, &comments, index, message, &mut problems);
        }
        for (index, enumeration) in file.enum_type.iter().enumerate() {
            let path = [FILE_ENUM, index as i32];
            let name = enumeration.name();
            let about = comments.of_element(&path, &format!("enum {name}"), &mut problems);
            let head = "| value | number | meaning |\n|---|--:|---|";
            open_section(&mut out, &format!("`{name}`"), &about, head);
            for (number, value) in enumeration.value.iter().enumerate() {
                let what = format!("enum value {name}.{}", value.name());
                let text = comments.of_child(&path, number, &what, &mut problems);
                out.push_str(&format!(
                    "| `{}` | {} | {text} |\n",
                    value.name(),
                    value.number()
                ));
            }
            out.push('\n');
        }
    }
    if !problems.is_empty() {
        return Err(Undocumented { problems });
    }
    Ok(out.trim_end().to_owned() + "\n")
}

/// One message: its comment, then a table of its fields.
fn render_message(
    out: &mut String,
    comments: &Comments,
    index: usize,
    message: &DescriptorProto,
    problems: &mut Vec<String>,
) {
    let path = [FILE_MESSAGE, index as i32];
    let name = message.name();
    for nested in &message.nested_type {
        problems.push(format!(
            "{}: message {name} nests message {}; the reference shows top-level messages only",
            comments.file,
            nested.name()
        ));
    }
    for nested in &message.enum_type {
        problems.push(format!(
            "{}: message {name} nests enum {}; the reference shows top-level enums only",
            comments.file,
            nested.name()
        ));
    }
    let about = comments.of_element(&path, &format!("message {name}"), problems);
    let head = match message.field.is_empty() {
        true => "",
        false => "| field | number | type | meaning |\n|---|--:|---|---|",
    };
    open_section(out, &format!("`{name}`"), &about, head);
    for (number, field) in message.field.iter().enumerate() {
        let what = format!("field {name}.{}", field.name());
        let text = comments.of_child(&path, number, &what, problems);
        out.push_str(&format!(
            "| `{}` | {} | {} | {text} |\n",
            field.name(),
            field.number(),
            field_type(message, field),
        ));
    }
    let reserved: Vec<String> = message
        .reserved_range
        .iter()
        .map(|range| match (range.start(), range.end() - 1) {
            (start, end) if start == end => start.to_string(),
            (start, end) => format!("{start} to {end}"),
        })
        .collect();
    if !reserved.is_empty() {
        out.push_str(&format!(
            "\nField numbers no longer used (reserved): {}.\n",
            reserved.join(", ")
        ));
    }
    out.push('\n');
}

/// A field's type as a reader writes it: `repeated bytes`, `optional
/// uint64`, a link to a message, and the oneof it belongs to.
fn field_type(message: &DescriptorProto, field: &FieldDescriptorProto) -> String {
    let base = match field.r#type() {
        Type::Message | Type::Enum => type_link(field.type_name()),
        scalar => format!(
            "`{}`",
            scalar
                .as_str_name()
                .trim_start_matches("TYPE_")
                .to_lowercase()
        ),
    };
    if field.label() == Label::Repeated {
        return format!("repeated {base}");
    }
    if field.proto3_optional() {
        return format!("optional {base}");
    }
    match field
        .oneof_index
        .and_then(|index| message.oneof_decl.get(index as usize))
    {
        Some(oneof) => format!("{base}, one of `{}`", oneof.name()),
        None => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_page_is_what_the_protos_render() {
        let rendered = render().unwrap_or_else(|error| panic!("{error}"));
        crate::config_reference::tests::assert_checked_in(
            PAGE,
            &rendered,
            "proto/tally/v1/*.proto",
            REGENERATE,
        );
    }

    #[test]
    fn every_service_rpc_message_and_enum_is_on_the_page() {
        let page = render().expect("renders");
        let set = FileDescriptorSet::decode(tally_proto::FILE_DESCRIPTOR_SET).unwrap();
        for file in &set.file {
            for service in &file.service {
                assert!(page.contains(&format!("### Service `tally.v1.{}`", service.name())));
                for method in &service.method {
                    assert!(page.contains(&format!("| `{}` |", method.name())));
                }
            }
            for message in &file.message_type {
                assert!(page.contains(&format!("### `{}`\n", message.name())));
            }
            for enumeration in &file.enum_type {
                assert!(page.contains(&format!("### `{}`\n", enumeration.name())));
            }
        }
        assert!(page.contains(
            "| `Watch` | [`WatchRequest`](#watchrequest) | stream [`WatchEvent`](#watchevent) |"
        ));
        assert!(page.contains("| `since_last_sync_ms` | 6 | optional `uint64` |"));
        assert!(page.contains("| `ok` | 1 | [`AddResponse`](#addresponse), one of `outcome` |"));
    }

    #[test]
    fn an_element_without_a_comment_is_refused() {
        use prost_types::{MethodDescriptorProto, ServiceDescriptorProto, SourceCodeInfo};
        let commented = |path: &[i32], text: &str| Location {
            path: path.to_vec(),
            leading_comments: Some(text.into()),
            ..Location::default()
        };
        let field = |name: &str, number| FieldDescriptorProto {
            name: Some(name.into()),
            number: Some(number),
            r#type: Some(Type::Bytes as i32),
            ..FieldDescriptorProto::default()
        };
        let file = FileDescriptorProto {
            name: Some("t.proto".into()),
            message_type: vec![DescriptorProto {
                name: Some("M".into()),
                field: vec![field("a", 1), field("b", 2)],
                ..DescriptorProto::default()
            }],
            service: vec![ServiceDescriptorProto {
                name: Some("S".into()),
                method: vec![MethodDescriptorProto {
                    name: Some("Get".into()),
                    input_type: Some(".t.M".into()),
                    output_type: Some(".t.M".into()),
                    ..MethodDescriptorProto::default()
                }],
                ..ServiceDescriptorProto::default()
            }],
            source_code_info: Some(SourceCodeInfo {
                location: vec![
                    Location {
                        path: vec![FILE_SYNTAX],
                        leading_detached_comments: vec![" A file.\n".into()],
                        ..Location::default()
                    },
                    commented(&[FILE_MESSAGE, 0], " A message.\n"),
                    commented(&[FILE_MESSAGE, 0, CHILD, 0], " Documented.\n"),
                ],
            }),
            ..FileDescriptorProto::default()
        };
        let problems = match render_files(&[file]) {
            Ok(page) => panic!("rendered although elements have no comment:\n{page}"),
            Err(undocumented) => undocumented.problems,
        };
        assert_eq!(
            problems,
            [
                "t.proto: service S has no comment",
                "t.proto: rpc S.Get has no comment",
                "t.proto: field M.b has no comment",
            ]
        );
    }
}
