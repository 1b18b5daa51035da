//! The nvptx64 link step. rustc hands the "linker" the crate's bitcode
//! objects, the rlibs of `core`/`compiler_builtins`, `--export-symbol` names,
//! `--target-cpu` and `-o`; this links them with the toolchain's own
//! `llvm-link`, internalises everything but the kernels, optimises with
//! `opt -O3` and lowers to PTX with `llc`.
//!
//! The target's default linker (`llvm-bitcode-linker`) is not installable
//! here, so `ptx::build_arch` passes `-C linker=<this binary>` with
//! [`LINK_MODE_ENV`] set.

use crate::util;
use kernels_gpu::registry::{self, Kernel, Target};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Set (to anything) when this binary is invoked as the linker.
pub const LINK_MODE_ENV: &str = "XTASK_PTX_LINK";
/// Directory holding `llvm-link`, `opt`, `llc` of the pinned toolchain.
pub const LLVM_BIN_ENV: &str = "XTASK_LLVM_BIN";
/// PTX ISA feature for `llc`, e.g. `+ptx80`.
pub const PTX_FEATURE_ENV: &str = "XTASK_PTX_FEATURE";

/// Link mode entry: `args` are what rustc passed.
pub fn run(args: Vec<String>) -> Result<(), String> {
    let llvm =
        PathBuf::from(std::env::var(LLVM_BIN_ENV).map_err(|_| format!("{LLVM_BIN_ENV} not set"))?);
    let feature =
        std::env::var(PTX_FEATURE_ENV).map_err(|_| format!("{PTX_FEATURE_ENV} not set"))?;
    let mut objects = Vec::new();
    let mut rlibs = Vec::new();
    let mut exports = Vec::new();
    let mut out = None;
    let mut cpu = None;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => out = it.next(),
            "--target-cpu" => cpu = it.next(),
            "--export-symbol" => exports.extend(it.next()),
            "-L" | "--target" => {
                it.next();
            }
            s if s.ends_with(".rlib") => rlibs.push(PathBuf::from(s)),
            s if s.ends_with(".o") => objects.push(PathBuf::from(s)),
            _ => {} // -O3, --debug, --target-feature: decided here instead
        }
    }
    let out = PathBuf::from(out.ok_or("linker: no -o")?);
    let cpu = cpu.ok_or("linker: no --target-cpu")?;
    if objects.is_empty() || exports.is_empty() {
        return Err("linker: no objects or no exported kernels".into());
    }
    let work = out.with_extension("link");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;

    // Library members that are bitcode (skip rustc metadata).
    let mut lib_objs = Vec::new();
    for (i, rlib) in rlibs.iter().enumerate() {
        let dir = work.join(format!("lib{i}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        util::output(
            Command::new(llvm.join("llvm-ar"))
                .current_dir(&dir)
                .arg("x")
                .arg(rlib),
        )?;
        for e in std::fs::read_dir(&dir).map_err(|e| e.to_string())? {
            let p = e.map_err(|e| e.to_string())?.path();
            if is_bitcode(&p) {
                lib_objs.push(p);
            }
        }
    }
    lib_objs.sort();

    // Crate objects linked whole, library members only where needed.
    let crate_bc = work.join("crate.bc");
    util::output(
        Command::new(llvm.join("llvm-link"))
            .args(&objects)
            .arg("-o")
            .arg(&crate_bc),
    )?;
    // Collectives marked `convergent` before any optimisation runs (rustc
    // runs none: `ptx::build_arch` passes `-Cno-prepopulate-passes`).
    let crate_ll = work.join("crate.ll");
    util::output(
        Command::new(llvm.join("llvm-dis"))
            .arg(&crate_bc)
            .arg("-o")
            .arg(&crate_ll),
    )?;
    let ir = std::fs::read_to_string(&crate_ll).map_err(|e| e.to_string())?;
    let marked_ll = work.join("marked.ll");
    std::fs::write(&marked_ll, mark_convergent(&ir)?).map_err(|e| e.to_string())?;
    let marked_bc = work.join("marked.bc");
    util::output(
        Command::new(llvm.join("llvm-as"))
            .arg(&marked_ll)
            .arg("-o")
            .arg(&marked_bc),
    )?;
    let linked = work.join("linked.bc");
    let mut c = Command::new(llvm.join("llvm-link"));
    c.arg("--only-needed")
        .arg(&marked_bc)
        .args(&lib_objs)
        .arg("-o")
        .arg(&linked);
    util::output(&mut c)?;

    let opt_bc = work.join("opt.bc");
    util::output(
        Command::new(llvm.join("opt"))
            .arg(format!(
                "--internalize-public-api-list={}",
                exports.join(",")
            ))
            .arg("--passes=internalize,globaldce,default<O3>")
            .arg(format!(
                "-unroll-threshold={}",
                crate::ptx::UNROLL_THRESHOLD
            ))
            .arg(&linked)
            .arg("-o")
            .arg(&opt_bc),
    )?;
    util::output(
        Command::new(llvm.join("llc"))
            .args([
                "-O3",
                "-march=nvptx64",
                &format!("-mcpu={cpu}"),
                &format!("-mattr={feature}"),
            ])
            .arg(&opt_bc)
            .arg("-o")
            .arg(&out),
    )?;
    let ptx = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
    // Launch bounds and tensor-map parameter alignment of the kernels in
    // this target's PTX, from the registry (`kernels_gpu::registry`): the
    // entries this build exports (the product's, the lab's or a watchdog
    // build's).
    let target = Target::from_name(&cpu).ok_or_else(|| format!("unknown target {cpu}"))?;
    let kernels: Vec<&Kernel> = registry::KERNELS
        .iter()
        .filter(|k| k.targets.contains(target) && exports.iter().any(|e| e == k.name))
        .collect();
    let (bounds, exact) = launch_bounds(&kernels, target);
    let ptx = add_launch_bounds(&ptx, &bounds, &exact)?;
    let maps: Vec<&str> = kernels
        .iter()
        .filter(|k| k.tensor_maps)
        .map(|k| k.name)
        .collect();
    let ptx = if maps.is_empty() {
        ptx
    } else {
        align_first_param(&ptx, &maps, kernels_gpu::abi::TENSOR_MAP_ALIGN)?
    };
    std::fs::write(&out, ptx).map_err(|e| e.to_string())?;
    Ok(())
}

/// The `(kernel, threads, resident CTAs)` bounds of `kernels` in `target`'s
/// PTX (see `Kernel::min_ctas`), and the kernels among them launched with
/// exactly their block (`.reqntid`).
pub fn launch_bounds<'a>(
    kernels: &[&'a Kernel],
    target: Target,
) -> (Vec<(&'a str, u32, u32)>, Vec<&'a str>) {
    let bounds = kernels
        .iter()
        .filter_map(|k| Some((k.name, k.threads, k.min_ctas(target)?)))
        .collect();
    let exact = kernels
        .iter()
        .filter(|k| k.exact_block())
        .map(|k| k.name)
        .collect();
    (bounds, exact)
}

/// Writes `.maxntid T, 1, 1` and `.minnctapersm N` after the parameter list
/// of each named kernel (between `)` and `{`, where PTX puts performance
/// directives); for a kernel listed in `exact`, `.reqntid T, 1, 1` (always
/// launched with exactly T threads) instead of `.maxntid`. A named kernel
/// missing from the PTX is an error.
pub fn add_launch_bounds(
    ptx: &str,
    bounds: &[(&str, u32, u32)],
    exact: &[&str],
) -> Result<String, String> {
    let mut out = String::with_capacity(ptx.len() + 64 * bounds.len());
    let mut pending: Option<(u32, u32, bool)> = None;
    let mut found = 0;
    for line in ptx.lines() {
        out.push_str(line);
        out.push('\n');
        if let Some(name) = line
            .split(".entry ")
            .nth(1)
            .and_then(|r| r.split('(').next())
        {
            pending = bounds
                .iter()
                .find(|b| b.0 == name)
                .map(|b| (b.1, b.2, exact.contains(&name)));
        } else if line.starts_with(')') {
            // `)` may carry a trailing `// @name` comment from llc.
            if let Some((threads, ctas, exact)) = pending.take() {
                let directive = if exact { "reqntid" } else { "maxntid" };
                out.push_str(&format!(
                    ".{directive} {threads}, 1, 1\n.minnctapersm {ctas}\n"
                ));
                found += 1;
            }
        }
    }
    if found != bounds.len() {
        return Err(format!(
            "launch bounds: {found} of {} kernels found in the PTX",
            bounds.len()
        ));
    }
    Ok(out)
}

/// Raises the declared alignment of the first (by-value struct) parameter
/// of each named kernel to `align` bytes: `.param .align N .b8
/// <kernel>_param_0[..]` becomes `.param .align <align> ...`. rustc cannot
/// declare by-value kernel parameters aligned above 16 bytes, but a
/// `CUtensorMap` inside one must be 64-byte aligned in the parameter space
/// (see `kernels_gpu::abi::TensorMap`); offsets inside the parameter are
/// unchanged. A named kernel missing from the PTX is an error.
pub fn align_first_param(ptx: &str, kernels: &[&str], align: u32) -> Result<String, String> {
    let mut out = String::with_capacity(ptx.len() + 16 * kernels.len());
    let mut found = 0;
    for line in ptx.lines() {
        let t = line.trim_start();
        let hit = kernels
            .iter()
            .any(|k| t.starts_with(".param .align ") && t.contains(&format!(" .b8 {k}_param_0[")));
        if hit {
            let rest = t
                .strip_prefix(".param .align ")
                .and_then(|r| r.split_once(' '))
                .map(|(_, r)| r)
                .ok_or_else(|| format!("unexpected parameter line: {line}"))?;
            let indent = &line[..line.len() - t.len()];
            out.push_str(&format!("{indent}.param .align {align} {rest}"));
            found += 1;
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    if found != kernels.len() {
        return Err(format!(
            "parameter alignment: {found} of {} kernels found in the PTX",
            kernels.len()
        ));
    }
    Ok(out)
}

/// Marks the crate's warp-collective inline assembly and every function it
/// defines `convergent` in textual LLVM IR, as clang does for CUDA.
///
/// rustc has no way to declare an `asm!` block convergent, so LLVM treats
/// a `tcgen05.ld.sync.aligned` like any other call and may copy it into
/// both arms of a branch (tail duplication, jump threading, loop
/// unswitching) or sink it into one; on a lane-dependent branch that
/// splits the warp across two copies of an instruction every lane must
/// execute together. A `convergent` call may not be made control-dependent
/// on more values than in the source, which forbids exactly those
/// transformations; a convergent function likewise (LLVM drops the
/// attribute again from functions that call nothing convergent).
///
/// An inline-asm call is collective when one of its PTX instructions is
/// (`converge::is_collective`). Its attribute group `#N` is replaced by a
/// new group holding `#N`'s attributes plus `convergent` (a call with no
/// group gets one holding only `convergent`); every `define` likewise.
pub fn mark_convergent(ir: &str) -> Result<String, String> {
    // Attribute groups: id -> body between the braces.
    let mut groups: std::collections::BTreeMap<u64, String> = std::collections::BTreeMap::new();
    for l in ir.lines() {
        if let Some(rest) = l.strip_prefix("attributes #") {
            let (id, body) = rest
                .split_once(" = { ")
                .ok_or_else(|| format!("unexpected attribute line: {l}"))?;
            let id: u64 = id.parse().map_err(|_| format!("bad attribute id: {l}"))?;
            groups.insert(id, body.trim_end_matches(" }").to_string());
        }
    }
    let mut next = groups.keys().next_back().map_or(0, |m| m + 1);
    // Old group (None: no group) -> its convergent copy.
    let mut copies: std::collections::BTreeMap<Option<u64>, u64> = Default::default();
    let mut convergent_group = |old: Option<u64>| -> u64 {
        *copies.entry(old).or_insert_with(|| {
            next += 1;
            next - 1
        })
    };
    let mut out = String::with_capacity(ir.len() + ir.len() / 16);
    let mut defines = 0usize;
    for l in ir.lines() {
        let is_define = l.starts_with("define ");
        let collective = !is_define && asm_text(l).is_some_and(asm_is_collective);
        if !(is_define || collective) {
            out.push_str(l);
            out.push('\n');
            continue;
        }
        // The group reference ends the attribute list: before any `, !md`
        // on a call, before ` {` on a define.
        let end = if is_define {
            l.rfind(" {")
                .ok_or_else(|| format!("define without body: {l}"))?
        } else {
            l.find(", !").unwrap_or(l.len())
        };
        let head = &l[..end];
        let (prefix, old) = match head.rsplit_once(" #") {
            Some((p, id)) if id.chars().all(|c| c.is_ascii_digit()) && !id.is_empty() => {
                (p, Some(id.parse::<u64>().map_err(|e| e.to_string())?))
            }
            _ => (head, None),
        };
        let new = convergent_group(old);
        out.push_str(&format!("{prefix} #{new}{}\n", &l[end..]));
        defines += usize::from(is_define);
    }
    if defines == 0 {
        return Err("mark_convergent: no function definitions in the IR".into());
    }
    for (old, new) in copies {
        let body = match old {
            Some(o) => {
                let b = groups
                    .get(&o)
                    .ok_or_else(|| format!("attribute group #{o} not defined"))?;
                format!("{b} convergent")
            }
            None => "convergent".to_string(),
        };
        out.push_str(&format!("attributes #{new} = {{ {body} }}\n"));
    }
    Ok(out)
}

/// The assembly string of an inline-asm call line (IR escapes decoded
/// where they matter: newline and tab), if the line is one.
fn asm_text(line: &str) -> Option<String> {
    let l = line.trim_start();
    if !(l.contains("call ") && l.contains(" asm ")) || l.starts_with("module asm") {
        return None;
    }
    let after = &l[l.find(" asm ")? + 5..];
    let start = after.find('"')? + 1;
    let len = after[start..].find('"')?;
    Some(
        after[start..start + len]
            .replace("\\0A", " ")
            .replace("\\09", " "),
    )
}

/// Whether any PTX instruction in an inline-asm string is collective.
fn asm_is_collective(asm: String) -> bool {
    asm.split(|c: char| c.is_whitespace() || matches!(c, ';' | '{' | '}'))
        .any(crate::converge::is_collective)
}

fn is_bitcode(p: &Path) -> bool {
    std::fs::read(p)
        .map(|b| b.starts_with(b"BC\xc0\xde"))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_bounds_go_between_parameters_and_body() {
        let ptx =
            ".visible .entry k1(\n\t.param .u64 p\n)\n{\n\tret;\n}\n.visible .entry k2(\n)\n{\n}\n";
        let out = add_launch_bounds(ptx, &[("k1", 256, 2)], &[]).unwrap();
        assert!(
            out.contains(")\n.maxntid 256, 1, 1\n.minnctapersm 2\n{\n\tret;"),
            "{out}"
        );
        assert_eq!(out.matches(".maxntid").count(), 1);
        assert!(add_launch_bounds(ptx, &[("k3", 128, 1)], &[]).is_err());
        // An exact block size is written as such.
        let out = add_launch_bounds(ptx, &[("k1", 256, 2), ("k2", 512, 1)], &["k2"]).unwrap();
        assert!(
            out.contains(")\n.maxntid 256, 1, 1\n.minnctapersm 2\n{\n\tret;"),
            "{out}"
        );
        assert!(
            out.contains("k2(\n)\n.reqntid 512, 1, 1\n.minnctapersm 1\n{"),
            "{out}"
        );
    }

    #[test]
    fn first_parameter_alignment_is_raised_only_for_named_kernels() {
        let ptx = ".visible .entry k1(\n\t.param .align 16 .b8 k1_param_0[368]\n)\n{\n}\n\
.visible .entry k2(\n\t.param .align 16 .b8 k2_param_0[368]\n)\n{\n}\n";
        let out = align_first_param(ptx, &["k1"], 64).unwrap();
        assert!(
            out.contains("\t.param .align 64 .b8 k1_param_0[368]\n"),
            "{out}"
        );
        assert!(
            out.contains("\t.param .align 16 .b8 k2_param_0[368]\n"),
            "{out}"
        );
        assert!(align_first_param(ptx, &["k3"], 64).is_err());
    }

    #[test]
    fn collective_asm_and_definitions_become_convergent() {
        let ir = "define void @k() unnamed_addr #0 {\n\
  %1 = tail call i32 asm \"shfl.sync.bfly.b32 ${0}, ${1}, 1, 0x1f, -1;\", \"=r,r\"(i32 %x) #1, !srcloc !2\n\
  %2 = tail call i32 asm \"ld.shared.b32 ${0}, [${1}];\", \"=r,r\"(i32 %y) #1, !srcloc !3\n\
  tail call void asm sideeffect \"{ .reg .pred p;\\0Abarrier.red.popc.u32 $0, 0, p; }\", \"\"()\n\
  tail call void asm sideeffect \"tcgen05.wait::ld.sync.aligned;\", \"\"() #1\n\
  ret void\n\
}\n\
attributes #0 = { nounwind \"target-cpu\"=\"sm_90a\" }\n\
attributes #1 = { nounwind memory(none) }\n";
        let out = mark_convergent(ir).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "define void @k() unnamed_addr #2 {");
        assert!(
            lines[1].ends_with("(i32 %x) #3, !srcloc !2"),
            "{}",
            lines[1]
        );
        // Not a collective: untouched, still the shared group.
        assert!(
            lines[2].ends_with("(i32 %y) #1, !srcloc !3"),
            "{}",
            lines[2]
        );
        assert!(lines[3].ends_with("\"\"() #4"), "{}", lines[3]);
        assert!(lines[4].ends_with("\"\"() #3"), "{}", lines[4]);
        assert!(out.contains("attributes #2 = { nounwind \"target-cpu\"=\"sm_90a\" convergent }"));
        assert!(out.contains("attributes #3 = { nounwind memory(none) convergent }"));
        assert!(out.contains("attributes #4 = { convergent }"));
        assert!(out.contains("attributes #1 = { nounwind memory(none) }"));
        assert!(mark_convergent("declare void @f()\n").is_err());
    }
}
