//! scripts/bench_ab.py: the before / after table of two builds' benchmark
//! JSON lines. Skipped when `python3` is missing.

use indexer_tests::script::{python, scripts_dir};

fn run(before: &[&str], after: &[&str]) -> Option<(i32, String, String)> {
    let s = scripts_dir().join("bench_ab.py");
    let mut args = vec![s.to_str().unwrap().to_string(), "--before".into()];
    args.extend(before.iter().map(|p| p.to_string()));
    args.push("--after".into());
    args.extend(after.iter().map(|p| p.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    python(&refs)
}

#[test]
fn points_pair_by_what_ran_and_ratio_the_means() {
    let dir = std::env::temp_dir().join(format!("bench-ab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, lines: &[&str]| {
        let p = dir.join(name);
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        p.to_str().unwrap().to_string()
    };
    let point = |ids: &str, topk: u32, us: f64, kernel: &str| {
        format!(
            r#"{{"kind":"forward","ids":"{ids}","heads":64,"dim":128,"topk":{topk},"kernel":"{kernel}","median_us":{us},"min_us":1.0,"valid_slots":7}}"#
        )
    };
    let ceil = r#"{"kind":"ceilings","gpu":"X","mma_tflops":600.0}"#;
    let b1 = write(
        "b1.jsonl",
        &[
            ceil,
            &point("uniform", 128, 100.0, "k_old"),
            &point("ragged", 128, 50.0, "k_old"),
        ],
    );
    let b2 = write("b2.jsonl", &[&point("uniform", 128, 110.0, "k_old")]);
    let a1 = write(
        "a1.jsonl",
        &[
            &point("uniform", 128, 84.0, "k_new"),
            &point("uniform", 256, 9.0, "k_new"),
        ],
    );
    let a2 = write("a2.jsonl", &[&point("uniform", 128, 84.0, "k_new")]);
    let Some((rc, out, err)) = run(&[&b1, &b2], &[&a1, &a2]) else {
        println!("skipped: no python3");
        return;
    };
    assert_eq!(rc, 0, "{err}");
    // 84 / mean(100, 110) = 0.8; every run listed; each side's kernel.
    let row = out
        .lines()
        .find(|l| l.contains("uniform") && l.contains("topk 128"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        row.contains("| 100.0, 110.0 | 84.0, 84.0 | 0.800 | k_old | k_new |"),
        "{row}"
    );
    // The ceilings line is no point; ragged has no after, topk 256 no before.
    assert!(!out.contains("ceilings"), "{out}");
    assert!(out.contains("missing after: forward, ragged"), "{out}");
    assert!(
        out.contains("missing before: forward, uniform, heads 64, dim 128, topk 256"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn both_sides_are_required() {
    let s = scripts_dir().join("bench_ab.py");
    let Some((rc, _, err)) = python(&[s.to_str().unwrap(), "--before", "x.jsonl"]) else {
        println!("skipped: no python3");
        return;
    };
    assert_ne!(rc, 0);
    assert!(err.contains("--after"), "{err}");
}
