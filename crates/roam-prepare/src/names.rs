//! Function names from the `name` custom section, for error messages.
//!
//! A refusal such as "function 12 `push_frame` uses `table.grow`" is only
//! actionable if it names the function the programmer wrote. The name section
//! is optional and untrusted, so any problem in it is ignored.
//!
//! Names are also how roam tells `wasm-opt` which functions Asyncify must
//! instrument (`asyncify-onlylist`), so [`make_names_listable`] gives every
//! function a unique name that Binaryen's list syntax cannot misread.

use std::collections::{HashMap, HashSet};

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

/// Whether Binaryen takes `name` verbatim in a comma-separated function list
/// (no separator, wildcard `*` or bracket that its parser treats specially).
pub(crate) fn listable(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '-'))
}

/// Give every function of `module` a unique, [`listable`] name. Names that
/// already are keep their text; others have each other character replaced by
/// `_`; unnamed functions become `f<index>`; clashes get `.1`, `.2`, ...
pub(crate) fn make_names_listable(module: &mut walrus::Module) {
    let ids: Vec<walrus::FunctionId> = module.funcs.iter().map(|f| f.id()).collect();
    let mut used = HashSet::new();
    for (index, id) in ids.into_iter().enumerate() {
        let func = module.funcs.get_mut(id);
        let base = match func.name.as_deref() {
            Some(n) if listable(n) => n.to_string(),
            Some(n) if !n.is_empty() => n
                .chars()
                .map(|c| if listable(&c.to_string()) { c } else { '_' })
                .collect(),
            _ => format!("f{index}"),
        };
        let mut name = base.clone();
        let mut suffix = 0u32;
        while !used.insert(name.clone()) {
            suffix += 1;
            name = format!("{base}.{suffix}");
        }
        func.name = Some(name);
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
    fn names_become_unique_and_listable() {
        let wasm = wat::parse_str(
            r#"(module
                (import "env" "ext" (func $imp))
                (func $a) (func $b) (func $c) (func $d) (func))"#,
        )
        .unwrap();
        let mut module = walrus::Module::from_buffer(&wasm).unwrap();
        for (from, to) in [
            ("imp", "dup"),
            ("a", "dup"),
            ("b", "ok_name.1"),
            ("c", "bad<i32,i64>"),
            ("d", "star*"),
        ] {
            let id = module.funcs.by_name(from).unwrap();
            module.funcs.get_mut(id).name = Some(to.into());
        }
        make_names_listable(&mut module);
        let names: Vec<String> = module
            .funcs
            .iter()
            .map(|f| f.name.clone().unwrap())
            .collect();
        assert_eq!(
            names,
            ["dup", "dup.1", "ok_name.1", "bad_i32_i64_", "star_", "f5"]
        );
        assert!(names.iter().all(|n| listable(n)));
    }

    #[test]
    fn describes_with_and_without_name() {
        assert_eq!(describe_function(3, Some("f")), "function 3 `f`");
        assert_eq!(describe_function(3, None), "function 3");
    }
}
