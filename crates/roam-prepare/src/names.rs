//! Function names from the `name` custom section, for error messages.
//!
//! A refusal such as "function 12 `push_frame` uses `table.grow`" is only
//! actionable if it names the function the programmer wrote. The name section
//! is optional and untrusted, so any problem in it is ignored.

use std::collections::HashMap;

use wasmparser::{KnownCustom, Name, Parser, Payload};

/// Map from function index (imports included) to its name. Empty when the
/// module has no readable name section.
pub(crate) fn function_names(module: &[u8]) -> HashMap<u32, String> {
    let mut names = HashMap::new();
    for payload in Parser::new(0).parse_all(module) {
        let Ok(payload) = payload else { break };
        let Payload::CustomSection(custom) = payload else {
            continue;
        };
        let KnownCustom::Name(reader) = custom.as_known() else {
            continue;
        };
        for subsection in reader {
            let Ok(Name::Function(map)) = subsection else {
                continue;
            };
            for naming in map.into_iter().flatten() {
                names.insert(naming.index, naming.name.to_string());
            }
        }
    }
    names
}

/// `function 12 `name`` or `function 12` when unnamed.
pub(crate) fn describe_function(index: u32, name: Option<&str>) -> String {
    match name {
        Some(name) => format!("function {index} `{name}`"),
        None => format!("function {index}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_of_imported_and_defined_functions() {
        let wasm = wat::parse_str(
            r#"(module
                (import "env" "ext" (func $ext))
                (func $mine)
                (func))"#,
        )
        .unwrap();
        let names = function_names(&wasm);
        assert_eq!(names.get(&0).map(String::as_str), Some("ext"));
        assert_eq!(names.get(&1).map(String::as_str), Some("mine"));
        assert_eq!(names.get(&2), None);
    }

    #[test]
    fn garbage_yields_no_names() {
        assert!(function_names(b"not wasm at all").is_empty());
    }

    #[test]
    fn describes_with_and_without_name() {
        assert_eq!(describe_function(3, Some("f")), "function 3 `f`");
        assert_eq!(describe_function(3, None), "function 3");
    }
}
