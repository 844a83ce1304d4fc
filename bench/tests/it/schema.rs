//! `memra-bench decode --schema`: the timed requests are constrained by a JSON Schema, the row
//! says so and counts the tokens generated, and the output is the schema's JSON.

use std::path::Path;
use std::process::Command;

use memra_bench::record::{Row, Workload};

fn decode(model: &Path, schema: &Path, out: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_memra-bench"))
        .arg("decode")
        .arg(model)
        .args([
            "--device", "cpu", "--prompt", "16", "--gen", "16", "--runs", "1",
        ])
        .args(["--quiet", "--run", "schema-test", "--schema"])
        .arg(schema)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn constrained_decode_row_is_marked_and_its_output_follows_the_schema() {
    let model = memra_engine::testing::real_model();
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/small.json");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rows.jsonl");
    let o = decode(&model, &schema, &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let rows = memra_bench::record::read_dir(dir.path()).unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r: &Row = &rows[0];
    assert_eq!((r.workload, r.valid), (Workload::Decode, true));
    assert_eq!(r.constraint.as_deref(), Some("json_schema"));
    assert_eq!(r.schema.as_deref(), Some("small.json"));
    assert!(r.value.unwrap() > 0.0);
    let line = std::fs::read_to_string(&out).unwrap();
    assert!(line.contains(r#""constraint":"json_schema""#), "{line}");
    // The reference run's output, as the bench printed it: JSON valid for the schema.
    let text = err
        .lines()
        .find_map(|l| l.split_once("schema output, prompt 16, ").map(|x| x.1))
        .unwrap_or_else(|| panic!("no schema output in {err}"));
    let (n, quoted) = text.split_once(" tokens: ").unwrap();
    let n: u64 = n.parse().unwrap();
    assert_eq!(r.generated, Some(n), "the row counts the tokens generated");
    assert!((2..=16).contains(&n));
    let text: String = serde_json::from_str(quoted).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("output {text:?} is not JSON: {e}"));
    let o = v.as_object().unwrap();
    assert!(o["ok"].is_boolean(), "{text}");
    assert_eq!(o.len(), 1, "{text}");
    assert!(n < 16, "the grammar ended the output before --gen: {text}");

    // A bad schema file is an error naming the file.
    for (name, body) in [("broken.json", "{not json"), ("odd.json", r#"{"type": 7}"#)] {
        let bad = dir.path().join(name);
        std::fs::write(&bad, body).unwrap();
        let o = decode(&model, &bad, &dir.path().join("bad.jsonl"));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert!(err.contains(name), "{err}");
    }
    let o = decode(
        &model,
        &dir.path().join("absent.json"),
        &dir.path().join("bad.jsonl"),
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("absent.json"));
    assert!(!dir.path().join("bad.jsonl").exists());
}
