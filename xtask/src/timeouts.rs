//! A check of the committed sm_100f PTX (a test, like `descriptors`): after
//! a bounded wait of a bring-up probe gives up, no path touches tensor
//! memory or leaves the kernel before it traps.
//!
//! Why: the probe kernels (`kernels-gpu/src/sm100/probe.rs`) wait for TMA
//! bytes and an MMA commit with a time limit read from `%globaltimer`. When
//! a wait gives up, the load or MMA it waited for may still be in flight
//! and may still write the CTA's shared memory or tensor memory. Reading or
//! freeing the accumulator then races with it, and a CTA that exits hands
//! that memory to the next CTA on the SM while the write can still land.
//! The kernel must trap instead (`give_up`).
//!
//! The check, per function, on the control-flow graph that `converge`
//! parses: a bounded wait is a loop (a block on a cycle) that reads
//! `%globaltimer`; its timeout exits are the edges from such a block to
//! blocks outside its cycle. From every timeout exit, every path must reach
//! `trap` (or a call to a `.noreturn` function) before any `tcgen05`
//! instruction other than a fence, and before leaving the function.

use crate::converge::{blocks, functions, noreturn_functions, reachability, Block};

/// A path from a timed-out wait to a forbidden instruction or the exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Kernel or function name.
    pub function: String,
    /// 1-based line of the `%globaltimer` read of the wait that gave up.
    pub wait_line: usize,
    /// 1-based line of the instruction reached (of the block's last
    /// instruction when the path leaves the function).
    pub line: usize,
    /// The opcode reached, or `exit`.
    pub what: String,
}

/// What a timeout path must not reach before it traps: tensor-memory
/// access or allocation (every `tcgen05` instruction but the fences, which
/// touch no memory).
fn touches_tensor_memory(opcode: &str) -> bool {
    opcode.starts_with("tcgen05.") && !opcode.starts_with("tcgen05.fence")
}

/// Whether an instruction ends the grid: `trap`.
fn aborts(opcode: &str) -> bool {
    opcode == "trap"
}

/// Checks every function of `ptx`. Returns the findings and, per function
/// that has any, the number of bounded waits found (so that a test can
/// tell a passing check from one that found nothing to check).
pub fn check(ptx: &str) -> (Vec<Finding>, Vec<(String, usize)>) {
    let noreturn = noreturn_functions(ptx);
    let mut findings = Vec::new();
    let mut waits = Vec::new();
    for (name, stmts) in functions(ptx) {
        if !stmts.iter().any(|(_, s)| s.contains("%globaltimer")) {
            continue;
        }
        let bl = blocks(&stmts, &noreturn);
        let (f, w) = check_function(&name, &bl);
        findings.extend(f);
        if w > 0 {
            waits.push((name, w));
        }
    }
    (findings, waits)
}

fn check_function(name: &str, bl: &[Block]) -> (Vec<Finding>, usize) {
    let reach = reachability(bl);
    let mut findings = Vec::new();
    let mut waits = 0;
    for (b, block) in bl.iter().enumerate() {
        let Some(timer) = block
            .insts
            .iter()
            .find(|i| i.operands.iter().any(|o| o.contains("%globaltimer")))
        else {
            continue;
        };
        if !reach[b][b] {
            // The read of the wait's start time, before its loop.
            continue;
        }
        waits += 1;
        let mut seen = vec![false; bl.len()];
        let mut stack: Vec<usize> = block
            .succs
            .iter()
            .flatten()
            .copied()
            .filter(|&s| !(reach[s][b] && reach[b][s]))
            .collect();
        while let Some(x) = stack.pop() {
            if std::mem::replace(&mut seen[x], true) {
                continue;
            }
            let mut stopped = false;
            for i in &bl[x].insts {
                if aborts(&i.opcode) && i.guard.is_none() {
                    stopped = true;
                    break;
                }
                if touches_tensor_memory(&i.opcode) {
                    findings.push(Finding {
                        function: name.to_string(),
                        wait_line: timer.line,
                        line: i.line,
                        what: i.opcode.clone(),
                    });
                    stopped = true;
                    break;
                }
            }
            if stopped {
                continue;
            }
            if bl[x].succs.contains(&None) {
                findings.push(Finding {
                    function: name.to_string(),
                    wait_line: timer.line,
                    line: bl[x].insts.last().map_or(timer.line, |i| i.line),
                    what: "exit".to_string(),
                });
                continue;
            }
            stack.extend(bl[x].succs.iter().flatten().copied());
        }
    }
    findings.sort_by_key(|f| (f.wait_line, f.line));
    findings.dedup();
    (findings, waits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(timeout_path: &str) -> String {
        format!(
            ".version 8.8\n.target sm_100f\n.address_size 64\n\n.visible .entry k(\n\t.param .u64 k_param_0\n)\n{{\n\t.reg .pred %p<9>;\n\t.reg .b32 %r<99>;\n\t.reg .b64 %rd<99>;\n\
             \tmov.u64 %rd1, %globaltimer;\n\
             $L__BB0_1:\n\
             \t{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%r1], 0; selp.u32 %r2, 1, 0, p; }}\n\
             \tsetp.ne.b32 %p1, %r2, 0;\n\
             \t@%p1 bra $L__BB0_3;\n\
             \tmov.u64 %rd2, %globaltimer;\n\
             \tsub.s64 %rd3, %rd2, %rd1;\n\
             \tsetp.lt.u64 %p2, %rd3, 1000000001;\n\
             \t@%p2 bra $L__BB0_1;\n\
             {timeout_path}\
             $L__BB0_3:\n\
             \ttcgen05.ld.sync.aligned.32x32b.x16.b32 {{%r60, %r61, %r62, %r63, %r64, %r65, %r66, %r67, %r68, %r69, %r70, %r71, %r72, %r73, %r74, %r75}}, [%r9];\n\
             \ttcgen05.wait::ld.sync.aligned;\n\
             \tbar.warp.sync -1;\n\
             \ttcgen05.dealloc.cta_group::1.sync.aligned.b32 %r9, 512;\n\
             \tret;\n}}\n"
        )
    }

    /// The defect: the timeout path records the failure and carries on
    /// into the read-back and the dealloc, as the probes once did.
    #[test]
    fn a_timeout_that_falls_into_the_read_back_is_found() {
        let ptx = kernel("\tst.volatile.global.u32 [%rd6], 1;\n");
        let (f, waits) = check(&ptx);
        assert_eq!(waits, [("k".to_string(), 1)]);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].what.starts_with("tcgen05.ld"), "{f:?}");
        let timer = 1 + ptx
            .lines()
            .position(|l| l.contains("%rd2, %globaltimer"))
            .unwrap();
        assert_eq!(f[0].wait_line, timer);
    }

    #[test]
    fn a_timeout_that_traps_passes() {
        let ptx = kernel("\tst.volatile.global.u32 [%rd6], 1;\n\tfence.sc.sys;\n\ttrap;\n");
        assert_eq!(check(&ptx), (vec![], vec![("k".to_string(), 1)]));
    }

    #[test]
    fn a_timeout_that_returns_is_found() {
        let ptx = kernel("\tst.volatile.global.u32 [%rd6], 1;\n\tret;\n");
        let (f, _) = check(&ptx);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].what, "exit");
    }

    /// Issuing more work after a timed-out wait touches tensor memory too
    /// (the probes once issued the MMA after the TMA wait gave up), even
    /// when it goes through another wait first.
    #[test]
    fn a_timeout_that_issues_an_mma_or_waits_again_is_found() {
        let ptx =
            kernel("\ttcgen05.mma.cta_group::1.kind::f16 [%r9], %rd4, %rd5, %r8, 1;\n\ttrap;\n");
        let (f, _) = check(&ptx);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].what.starts_with("tcgen05.mma"), "{f:?}");
        // Through a second (unbounded) wait to the read-back.
        let ptx = kernel(
            "$L__BB0_2:\n\t{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%r3], 0; selp.u32 %r4, 1, 0, p; }\n\tsetp.eq.b32 %p3, %r4, 0;\n\t@%p3 bra $L__BB0_2;\n",
        );
        let (f, _) = check(&ptx);
        assert!(!f.is_empty(), "{f:?}");
        // A guarded trap does not end every path.
        let ptx = kernel("\t@%p4 trap;\n");
        assert!(!check(&ptx).0.is_empty());
    }

    /// The committed probes: every bounded wait (the TMA bytes and the MMA
    /// commit of each of the three kernels) traps when it gives up.
    #[test]
    fn the_committed_probes_trap_after_a_timed_out_wait() {
        let root = crate::util::repo_root();
        let path = crate::ptx::Variant::Lab.ptx_path(&root, "sm_100f");
        let text = std::fs::read_to_string(&path).unwrap();
        let (f, waits) = check(&text);
        for probe in ["sm100_probe_s", "sm100_probe_dq", "sm100_probe_dk"] {
            let n = waits.iter().find(|(w, _)| w == probe).map_or(0, |w| w.1);
            assert!(
                n >= 2,
                "{probe}: {n} bounded waits found, expected the TMA and MMA waits"
            );
        }
        assert!(
            f.is_empty(),
            "{}",
            f.iter()
                .map(|f| format!(
                    "{}: the wait at line {} reaches `{}` at line {} before a trap",
                    f.function, f.wait_line, f.what, f.line
                ))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
