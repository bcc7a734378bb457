use walrus::{ModuleConfig, ValType};
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let input = std::fs::read(&a[1]).unwrap();
    let mut config = ModuleConfig::new();
    config.generate_dwarf(false).generate_name_section(true).generate_producers_section(true);
    let mut m = config.parse(&input).unwrap();
    let has = |k: &str| std::env::var(k).is_ok();
    if has("GLOBALS") {
        let g: Vec<_> = m.globals.iter().filter(|g| g.mutable).map(|g| g.id()).collect();
        for (i, id) in g.into_iter().enumerate() { m.exports.add(&format!("roam.global.{i}"), id); }
    }
    if has("TABLES") {
        let t: Vec<_> = m.tables.iter().map(|t| t.id()).collect();
        for (i, id) in t.into_iter().enumerate() { m.exports.add(&format!("roam.table.{i}"), id); }
    }
    if has("MEM") {
        let t: Vec<_> = m.memories.iter().map(|t| t.id()).collect();
        for id in t { m.exports.add("roam.memory", id); }
    }
    if has("FLAG") {
        let f = m.globals.add_local(ValType::I32, true, false, walrus::ConstExpr::Value(walrus::ir::Value::I32(0)));
        m.exports.add("roam.flag", f);
    }
    if has("IMPORT") {
        let ty = m.types.add(&[], &[]);
        m.add_import_func("roam", "migration_point", ty);
    }
    std::fs::write(&a[2], m.emit_wasm()).unwrap();
}
