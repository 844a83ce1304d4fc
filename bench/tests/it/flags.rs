//! docs/FLAGS.md is exactly what `memra-bench flags` makes of the one table of settings.

#[test]
fn committed_flags_md_is_generated_from_the_settings_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/FLAGS.md");
    let committed = std::fs::read_to_string(path).expect("docs/FLAGS.md");
    assert!(
        committed == memra_bench::flags::markdown(),
        "docs/FLAGS.md is not what engine/src/settings.rs gives: run \
         `memra-bench flags --out docs/FLAGS.md` and commit"
    );
}
