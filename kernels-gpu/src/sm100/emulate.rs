//! Host emulation of one stage-2 row, built only from the helpers the
//! device code uses (operand layouts and descriptors, the canonical-layout
//! address model, gather4 coordinates and padding, tensor-memory lane
//! mapping, the gate) and compared with the SPEC math computed directly.
//! It checks that these pieces compose into the right gradients (operand
//! roles, transposes, padding, H = 32 zero rows, dQ accumulation over
//! chunks); it says nothing about the hardware, which has not run this.

use super::budget::{TMEM_DK, TMEM_DQ, TMEM_S};
use super::desc::{model_kmajor, model_mnmajor, swizzle128};
use super::gather::{gather4_coords, row_in_bounds, tma_row, Ids};
use super::operands::{
    dk_descs, dk_steps, dq_descs, ds_at, gather4_dst, q_at, s_descs, DQ_STEPS, IDESC_DK, IDESC_DQ,
    IDESC_S, S_STEPS,
};
use super::tmem::{lane_m128, lane_m64, m128_row_of, m64_row_of, warp_lane_base};
use crate::score::gate;
use std::vec;
use std::vec::Vec;

/// f32 -> bf16 bits, round to nearest even (finite inputs).
fn bf16(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}
fn from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

use crate::testing::Rng;

impl Rng {
    /// Uniform in [-1, 1), rounded to bf16.
    fn val(&mut self) -> f32 {
        from_bf16(bf16((self.next() % 20001) as f32 / 10000.0 - 1.0))
    }
}

/// Shared memory and tensor memory of one CTA.
struct Cta {
    smem: Vec<u8>,
    tmem: Vec<[f32; 512]>,
}

impl Cta {
    fn st(&mut self, addr: u32, v: u16) {
        self.smem[addr as usize..addr as usize + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn ld(&self, addr: u32) -> f32 {
        let a = addr as usize;
        from_bf16(u16::from_le_bytes([self.smem[a], self.smem[a + 1]]))
    }
    /// Operand element `(mn, kk)` through the descriptor, major-ness from
    /// the instruction descriptor (bit 15 A, 16 B).
    fn operand(&self, idesc: u32, which: u32, desc: u64, mn: u32, kk: u32) -> f32 {
        let f = |s: u32| (((desc >> s) & 0x3fff) as u32) << 4;
        let (start, lbo, sbo) = (f(0), f(16), f(32));
        assert_eq!(desc >> 61, 2, "128-byte swizzle");
        let addr = if (idesc >> (15 + which)) & 1 == 1 {
            model_mnmajor(start, lbo, sbo, mn, kk)
        } else {
            model_kmajor(start, sbo, mn, kk)
        };
        self.ld(addr)
    }
    /// One `tcgen05.mma` (K = 16) into columns `col..` of tensor memory.
    fn mma(&mut self, col: u32, a: u64, b: u64, idesc: u32, accumulate: bool) {
        let m = ((idesc >> 24) & 0x1f) << 4;
        let n = ((idesc >> 17) & 0x3f) << 3;
        for i in 0..m {
            let lane = if m == 64 { lane_m64(i) } else { lane_m128(i) } as usize;
            for j in 0..n {
                let mut acc = if accumulate {
                    self.tmem[lane][(col + j) as usize]
                } else {
                    0.0
                };
                for kk in 0..16 {
                    acc += self.operand(idesc, 0, a, i, kk) * self.operand(idesc, 1, b, j, kk);
                }
                self.tmem[lane][(col + j) as usize] = acc;
            }
        }
    }
}

struct Problem {
    heads: u32,
    nch: u32,
    batch: u32,
    seq_k: u32,
    b: u32,
    ids: Ids,
    q: Vec<f32>,  // heads x 128
    w: Vec<f32>,  // heads
    k: Vec<f32>,  // batch*seq_k x 128
    gs: Vec<f32>, // topk
    slot_ids: Vec<i32>,
    sm_scale: f32,
}

/// `(dq, dw, dk)` of one row, emulating the kernel's roles.
fn emulate(p: &Problem) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    const Q: u32 = 0x1_0000;
    const K: u32 = 0x0_8000;
    const DS: u32 = 0x1_8000;
    let mut cta = Cta {
        smem: vec![0; 0x2_0000],
        tmem: vec![[f32::NAN; 512]; 128],
    };
    let oob = (p.batch * p.seq_k) as i32;
    // q: TMA box of H rows; rows H..64 are the zero padding.
    for h in 0..64 {
        for d in 0..128 {
            let v = if h < p.heads {
                p.q[(h * 128 + d) as usize]
            } else {
                0.0
            };
            cta.st(Q + q_at(h, d), bf16(v));
        }
    }
    let mut dw = vec![0.0f32; 64];
    let mut dk = vec![0.0f32; (p.batch * p.seq_k * 128) as usize];
    for ch in 0..p.nch {
        // Load role: lane l gathers slots 4l..4l+4 (address-based swizzle).
        let mut valid = [false; 128];
        let mut key = [-1i32; 128];
        for lane in 0..32u32 {
            let t0 = (ch * 128 + 4 * lane) as usize;
            let id4 = [
                p.slot_ids[t0],
                p.slot_ids[t0 + 1],
                p.slot_ids[t0 + 2],
                p.slot_ids[t0 + 3],
            ];
            let coords = gather4_coords(&id4, p.b, p.batch, p.seq_k, p.ids);
            for (r, &c) in coords.iter().enumerate() {
                let slot = 4 * lane as usize + r;
                valid[slot] = c != oob;
                key[slot] = if c == oob { -1 } else { c };
                // The TMA unit zero-fills a row outside the map.
                let row = tma_row(c, oob);
                let inside = row_in_bounds(row, p.batch * p.seq_k);
                for d in 0..128u32 {
                    let at = swizzle128(gather4_dst(lane, d / 64) + r as u32 * 128 + (d % 64) * 2);
                    let v = if inside {
                        p.k[(row as u32 * 128 + d) as usize]
                    } else {
                        0.0
                    };
                    cta.st(K + at, bf16(v));
                }
            }
        }
        // MMA: S.
        for st in 0..S_STEPS {
            let (a, b) = s_descs(Q, K, st);
            cta.mma(TMEM_S, a, b, IDESC_S, st > 0);
        }
        // Compute role: warp w, lane l < 16 owns head 16w + l.
        for warp in 0..4u32 {
            for lane in 0..32u32 {
                let Some(h) = m64_row_of(warp, lane) else {
                    continue;
                };
                let tl = (warp_lane_base(warp) + lane) as usize;
                let wh = if h < p.heads { p.w[h as usize] } else { 0.0 };
                for t in 0..128u32 {
                    let acc = cta.tmem[tl][(TMEM_S + t) as usize];
                    let gs = p.gs[(ch * 128 + t) as usize];
                    let (ds, term) = gate(acc, p.sm_scale, gs, wh, valid[t as usize]);
                    dw[h as usize] += term;
                    cta.st(DS + ds_at(h, t), bf16(ds));
                }
            }
        }
        // MMA: dQ (accumulating over the row's chunks), dK.
        for st in 0..DQ_STEPS {
            let (a, b) = dq_descs(DS, K, st);
            cta.mma(TMEM_DQ, a, b, IDESC_DQ, ch > 0 || st > 0);
        }
        for st in 0..dk_steps(p.heads) {
            let (a, b) = dk_descs(DS, Q, st);
            cta.mma(TMEM_DK, a, b, IDESC_DK, st > 0);
        }
        // Reduce role: lane owns slot 32 (w % 4) + l.
        for warp in 4..8u32 {
            for lane in 0..32u32 {
                let slot = m128_row_of(warp, lane);
                let tl = (warp_lane_base(warp) + lane) as usize;
                if key[slot as usize] >= 0 {
                    for d in 0..128u32 {
                        let v = cta.tmem[tl][(TMEM_DK + d) as usize] * p.sm_scale;
                        dk[(key[slot as usize] as u32 * 128 + d) as usize] += v;
                    }
                }
            }
        }
    }
    // dQ epilogue.
    let mut dq = vec![0.0f32; (p.heads * 128) as usize];
    for warp in 0..4u32 {
        for lane in 0..16u32 {
            let h = m64_row_of(warp, lane).unwrap();
            if h < p.heads {
                let tl = (warp_lane_base(warp) + lane) as usize;
                for d in 0..128u32 {
                    dq[(h * 128 + d) as usize] = cta.tmem[tl][(TMEM_DQ + d) as usize] * p.sm_scale;
                }
            }
        }
    }
    dw.truncate(p.heads as usize);
    (dq, dw, dk)
}

/// The SPEC math for one row in f64, with dS rounded to bf16 as the tensor
/// cores take it.
fn reference(p: &Problem) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let topk = (p.nch * 128) as usize;
    let d = 128usize;
    let h_n = p.heads as usize;
    let mut dq = vec![0.0f64; h_n * d];
    let mut dw = vec![0.0f64; h_n];
    let mut dk = vec![0.0f64; (p.batch * p.seq_k) as usize * d];
    for t in 0..topk {
        let id = p.slot_ids[t];
        let n = match p.ids {
            Ids::Global => (id >= 0 && (id as u32) < p.batch * p.seq_k).then_some(id as usize),
            Ids::Local => {
                (id >= 0 && (id as u32) < p.seq_k).then(|| (p.b * p.seq_k) as usize + id as usize)
            }
        };
        let Some(n) = n else { continue };
        for h in 0..h_n {
            let dot: f64 = (0..d)
                .map(|i| p.q[h * d + i] as f64 * p.k[n * d + i] as f64)
                .sum();
            let s = p.sm_scale as f64 * dot;
            if s > 0.0 {
                let gs = p.gs[t] as f64;
                let ds = from_bf16(bf16((gs * p.w[h] as f64) as f32)) as f64;
                dw[h] += gs * s;
                for i in 0..d {
                    dq[h * d + i] += p.sm_scale as f64 * ds * p.k[n * d + i] as f64;
                    dk[n * d + i] += p.sm_scale as f64 * ds * p.q[h * d + i] as f64;
                }
            }
        }
    }
    (dq, dw, dk)
}

fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(1e-300)).sqrt()
}

fn problem(seed: u64, heads: u32, nch: u32, ids: Ids) -> Problem {
    let mut r = Rng(seed);
    let (batch, seq_k, b) = (2u32, 150u32, 1u32);
    let topk = (nch * 128) as usize;
    let mut slot_ids = Vec::with_capacity(topk);
    for t in 0..topk {
        let x = r.next();
        slot_ids.push(match x % 10 {
            0 => -1,                                           // padding by -1
            1 => (batch * seq_k + (x as u32 >> 8) % 7) as i32, // out of range
            2 => seq_k as i32,                                 // out of range for local ids
            3 if t > 0 => slot_ids[t - 1],                     // duplicate
            _ => {
                ((x >> 16)
                    % (if ids == Ids::Local {
                        seq_k
                    } else {
                        batch * seq_k
                    }) as u64) as i32
            }
        });
    }
    Problem {
        heads,
        nch,
        batch,
        seq_k,
        b,
        ids,
        q: (0..heads * 128).map(|_| r.val()).collect(),
        w: (0..heads).map(|_| r.val()).collect(),
        k: (0..batch * seq_k * 128).map(|_| r.val()).collect(),
        gs: (0..topk).map(|_| r.val() * 0.01).collect(),
        slot_ids,
        sm_scale: 0.37,
    }
}

#[test]
fn emulated_row_matches_the_spec() {
    for (seed, heads, nch, ids) in [
        (1u64, 64u32, 1u32, Ids::Global),
        (2, 32, 2, Ids::Local),
        (3, 64, 3, Ids::Local),
        (4, 32, 1, Ids::Global),
    ] {
        let p = problem(seed, heads, nch, ids);
        let (dq, dw, dk) = emulate(&p);
        let (rq, rw, rk) = reference(&p);
        let e = [rel_err(&dq, &rq), rel_err(&dw, &rw), rel_err(&dk, &rk)];
        // Only f32 accumulation order differs from the reference.
        assert!(
            e.iter().all(|&x| x < 1e-5),
            "H {heads} chunks {nch} {ids:?}: rel errors dq/dw/dk {e:?}"
        );
        assert!(rq.iter().any(|&x| x != 0.0) && rk.iter().any(|&x| x != 0.0));
        assert!(dq.iter().chain(&dw).chain(&dk).all(|x| x.is_finite()));
    }
}

/// Key rows that no valid slot of the row selects hold Inf and NaN, key
/// row 0 among them, and the row has padding slots. The SPEC math never
/// reads those rows, so every output must be finite and match it: a
/// padding slot's K row in shared memory has to be zeros (the TMA unit's
/// fill of an out-of-bounds gather row), since the dQ product multiplies
/// the slot's zero dS by it and `0 * Inf` is NaN.
#[test]
fn padding_slots_read_zeros_not_a_non_finite_key_row_zero() {
    for (seed, heads, nch, ids) in [
        (5u64, 64u32, 1u32, Ids::Global),
        (6, 32, 2, Ids::Local),
        (7, 64, 3, Ids::Global),
    ] {
        let mut p = problem(seed, heads, nch, ids);
        if ids == Ids::Global {
            // Slots that select key row 0 become padding (local ids of
            // batch 1 never reach it).
            p.slot_ids
                .iter_mut()
                .filter(|id| **id == 0)
                .for_each(|id| *id = -1);
        }
        let oob = (p.batch * p.seq_k) as i32;
        let selected: Vec<i32> = p
            .slot_ids
            .chunks(4)
            .flat_map(|c| gather4_coords(&[c[0], c[1], c[2], c[3]], p.b, p.batch, p.seq_k, p.ids))
            .filter(|&c| c != oob)
            .collect();
        assert!(selected.len() < p.slot_ids.len(), "the row has padding");
        assert!(!selected.contains(&0), "no valid slot selects key row 0");
        let poisoned: Vec<u32> = (0..p.batch * p.seq_k)
            .filter(|&r| !selected.contains(&(r as i32)))
            .collect();
        for &r in &poisoned {
            for d in 0..128 {
                p.k[(r * 128 + d) as usize] = match d % 3 {
                    0 => f32::INFINITY,
                    1 => f32::NAN,
                    _ => f32::NEG_INFINITY,
                };
            }
        }
        let (dq, dw, dk) = emulate(&p);
        let (rq, rw, rk) = reference(&p);
        assert!(rq.iter().chain(&rw).chain(&rk).all(|x| x.is_finite()));
        let bad = |v: &[f32]| v.iter().filter(|x| !x.is_finite()).count();
        assert_eq!(
            [bad(&dq), bad(&dw), bad(&dk)],
            [0, 0, 0],
            "H {heads} chunks {nch} {ids:?}: non-finite dq/dw/dk elements where the SPEC math is finite"
        );
        let e = [rel_err(&dq, &rq), rel_err(&dw, &rw), rel_err(&dk, &rk)];
        assert!(
            e.iter().all(|&x| x < 1e-5),
            "H {heads} chunks {nch} {ids:?}: rel errors dq/dw/dk {e:?}"
        );
    }
}
