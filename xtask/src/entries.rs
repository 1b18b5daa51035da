//! The kernel registry (`kernels_gpu::registry`) checked against the
//! committed PTX, the product's and the lab's: every entry is an `.entry`
//! of exactly the files of its home and targets, every `.entry` is an
//! entry, and each kernel's header carries
//! the parameter size, alignment and launch bounds the registry gives.

use crate::ptx::{ptx_path, Variant, ARCHS, LAB_ARCHS};
use crate::util::repo_root;
use kernels_gpu::registry::{self, Home, Target, KERNELS};
use std::collections::BTreeMap;

/// What the PTX declares for one kernel, up to its body's `{`.
#[derive(Debug, Default, PartialEq)]
struct Header {
    /// `.param .align A .b8 <name>_param_0[N]`: (A, N).
    param: Option<(u32, usize)>,
    /// `.maxntid` or `.reqntid` threads, and whether it was `.reqntid`.
    ntid: Option<(u32, bool)>,
    /// `.minnctapersm`.
    min_ctas: Option<u32>,
}

fn first_number(s: &str) -> Option<u64> {
    s.split(|c: char| !c.is_ascii_digit())
        .find(|t| !t.is_empty())?
        .parse()
        .ok()
}

/// The headers of every `.entry` of `ptx`, by name.
fn headers(ptx: &str) -> BTreeMap<String, Header> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, Header)> = None;
    for line in ptx.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        if let Some(rest) = code.split(".entry ").nth(1) {
            let name = rest.split('(').next().unwrap_or("").trim().to_string();
            current = Some((name, Header::default()));
            continue;
        }
        let Some((name, h)) = current.as_mut() else {
            continue;
        };
        if code.starts_with('{') {
            let (name, h) = current.take().unwrap();
            out.insert(name, h);
        } else if let Some(rest) = code.strip_prefix(".param .align ") {
            let align = first_number(rest).unwrap() as u32;
            let size = rest
                .split_once(&format!("{name}_param_0["))
                .and_then(|(_, r)| first_number(r))
                .unwrap() as usize;
            assert!(h.param.is_none(), "{name}: more than one parameter");
            h.param = Some((align, size));
        } else if let Some(rest) = code.strip_prefix(".maxntid ") {
            h.ntid = Some((first_number(rest).unwrap() as u32, false));
        } else if let Some(rest) = code.strip_prefix(".reqntid ") {
            h.ntid = Some((first_number(rest).unwrap() as u32, true));
        } else if let Some(rest) = code.strip_prefix(".minnctapersm ") {
            h.min_ctas = Some(first_number(rest).unwrap() as u32);
        }
    }
    out
}

/// What the registry says `kernel`'s header in `target`'s PTX must be.
fn expected(k: &registry::Kernel, target: Target) -> Header {
    let align = if k.tensor_maps {
        kernels_gpu::abi::TENSOR_MAP_ALIGN
    } else {
        // rustc's by-value parameters: the struct's own alignment (8 for
        // the u64 fields; 4 for the watchdog probe's u32 tag).
        if k.param == registry::Param::Tag {
            4
        } else {
            8
        }
    };
    Header {
        param: Some((align, k.param.size())),
        ntid: k.min_ctas(target).map(|_| (k.threads, k.exact_block())),
        min_ctas: k.min_ctas(target),
    }
}

/// Differences between the registry and the PTX text of `home`'s file for
/// `target`.
fn mismatches(ptx: &str, home: Home, target: Target) -> Vec<String> {
    let found = headers(ptx);
    let mut bad = Vec::new();
    for k in KERNELS.iter() {
        match (found.get(k.name), k.in_home(home, target)) {
            (Some(h), true) => {
                let want = expected(k, target);
                if *h != want {
                    bad.push(format!("{}: PTX has {h:?}, registry says {want:?}", k.name));
                }
            }
            (None, true) => bad.push(format!("{}: missing", k.name)),
            (Some(_), false) => bad.push(format!("{}: present, registry says absent", k.name)),
            (None, false) => {}
        }
    }
    for name in found.keys() {
        if registry::find(name).is_none() {
            bad.push(format!("{name}: an .entry the registry does not list"));
        }
    }
    bad
}

#[test]
fn every_registry_entry_is_in_the_ptx_of_exactly_its_targets() {
    let root = repo_root();
    assert_eq!(ARCHS.len(), Target::ALL.len());
    let files = ARCHS
        .iter()
        .map(|a| (Home::Product, a, ptx_path(&root, a.target)))
        .chain(
            LAB_ARCHS
                .iter()
                .map(|a| (Home::Lab, a, Variant::Lab.ptx_path(&root, a.target))),
        );
    for (home, arch, path) in files {
        let target = Target::from_name(arch.target).expect("a registry target");
        let ptx =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let bad = mismatches(&ptx, home, target);
        assert!(
            bad.is_empty(),
            "{}:\n  {}",
            path.display(),
            bad.join("\n  ")
        );
    }
}

#[test]
fn a_planted_mismatch_is_reported() {
    let ptx = std::fs::read_to_string(ptx_path(&repo_root(), "sm_90a")).unwrap();
    // A kernel the registry places elsewhere, and bounds changed.
    let stage2 = registry::SM100_STAGE2[0].name;
    // Stage 1's own bounds (other kernels have the same value).
    let at = ptx
        .find(&format!(".entry {}(", registry::STAGE1.name))
        .expect("stage 1 in the PTX");
    let (head, tail) = ptx.split_at(at);
    let planted = format!(
        "{head}{}",
        tail.replacen(".minnctapersm 3", ".minnctapersm 2", 1)
    )
    .replacen(
            ".visible .entry cast_f32_to_bf16(",
            &format!(".visible .entry {stage2}(\n.param .align 64 .b8 {stage2}_param_0[368]\n)\n{{\n}}\n.visible .entry cast_f32_to_bf16("),
            1,
        );
    let bad = mismatches(&planted, Home::Product, Target::Sm90a);
    assert!(
        bad.iter().any(|b| b.starts_with(registry::STAGE1.name)),
        "{bad:?}"
    );
    assert!(
        bad.iter()
            .any(|b| b.starts_with(stage2) && b.contains("absent")),
        "{bad:?}"
    );
    assert_eq!(bad.len(), 2, "{bad:?}");
}

#[test]
fn names_are_unique_and_threads_match_the_kernels_constants() {
    let mut names: Vec<_> = KERNELS.iter().map(|k| k.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), KERNELS.len());
    for k in registry::ROWS {
        assert_eq!(
            k.threads,
            kernels_gpu::portable::rows::GRAD_THREADS,
            "{}",
            k.name
        );
    }
    assert_eq!(registry::SM90_WG.threads, kernels_gpu::sm90::bwd::THREADS);
    assert_eq!(
        registry::SM90_WG_D64.threads,
        kernels_gpu::sm90::bwd::THREADS
    );
    assert_eq!(
        registry::SM90_WG_H32.threads,
        kernels_gpu::sm90::bwd::THREADS
    );
    assert_eq!(
        registry::SM90_WG_H16.threads,
        kernels_gpu::sm90::bwd::THREADS
    );
    assert_eq!(
        registry::SM90_WG_PAIR.threads,
        kernels_gpu::sm90::bwd::PAIR.threads
    );
    assert_eq!(registry::STAGE1.threads, kernels_gpu::abi::STAGE1_THREADS);
    assert_eq!(
        registry::STAGE1_D64.threads,
        kernels_gpu::abi::STAGE1_THREADS
    );
    for k in registry::SM100_STAGE2 {
        // Compute and reduce warpgroups, K-load and MMA warps.
        assert_eq!(k.threads, (kernels_gpu::sm100::proto::MMA_WARP + 1) * 32);
    }
}
