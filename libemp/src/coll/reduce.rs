//! The reference reduction: the one definition of what a reduce or
//! allreduce computes, bit for bit. The NIC control program implements the
//! same combine independently (uapi stays float-free), the host baselines
//! call this one, and the simulator's checker compares both against
//! [`reduce_ref`].
//!
//! Elements are little-endian. For every element, `acc ⊕= x` means:
//!
//! | op | integers (i32, i64, u32, u64) | floats (f32, f64) |
//! |---|---|---|
//! | sum | `acc.wrapping_add(x)` | `acc + x` (IEEE, round to nearest even) |
//! | prod | `acc.wrapping_mul(x)` | `acc * x` |
//! | min | `if x < acc { x } else { acc }` | same: a NaN `x` never replaces `acc`, a NaN `acc` stays |
//! | max | `if x > acc { x } else { acc }` | same |
//! | band, bor, bxor | `&`, `\|`, `^` | [`Error::InvalidOp`] |
//!
//! The accumulator is always the left operand. (Where a float sum or
//! product meets two NaNs, which payload survives is the hardware's choice;
//! results with at most one NaN operand per step are bit-exact.) A tree reduction folds in one fixed order
//! (`docs/design/collectives.md` §0): at every node `acc = own; for c in
//! children, ascending relative rank: acc ⊕= result(c)`. Integer results
//! do not depend on that order; float results do, which is why every
//! implementation must follow it.

use emp_uapi::coll::{Dtype, ReduceOp};

use crate::{Error, Result};

/// One element type as little-endian bytes.
trait Elem: Copy + PartialOrd {
    const SIZE: usize;
    fn load(b: &[u8]) -> Self;
    fn store(self, b: &mut [u8]);
}

macro_rules! elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = core::mem::size_of::<$t>();
            fn load(b: &[u8]) -> Self {
                // PANIC: callers pass chunks of exactly SIZE bytes.
                <$t>::from_le_bytes(b.try_into().expect("element-sized chunk"))
            }
            fn store(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
elem!(i32, i64, u32, u64, f32, f64);

/// `min` as the NIC computes it: `x` replaces `acc` only if strictly less.
fn pick_min<T: PartialOrd>(acc: T, x: T) -> T {
    if x < acc {
        x
    } else {
        acc
    }
}

/// `max` as the NIC computes it: `x` replaces `acc` only if strictly greater.
fn pick_max<T: PartialOrd>(acc: T, x: T) -> T {
    if x > acc {
        x
    } else {
        acc
    }
}

fn fold<T: Elem>(acc: &mut [u8], x: &[u8], f: impl Fn(T, T) -> T) {
    debug_assert_eq!(acc.len(), x.len());
    for (a, b) in acc.chunks_exact_mut(T::SIZE).zip(x.chunks_exact(T::SIZE)) {
        f(T::load(a), T::load(b)).store(a);
    }
}

macro_rules! int_combine {
    ($t:ty, $op:expr, $acc:expr, $x:expr) => {
        match $op {
            ReduceOp::Sum => fold::<$t>($acc, $x, |a, b| a.wrapping_add(b)),
            ReduceOp::Prod => fold::<$t>($acc, $x, |a, b| a.wrapping_mul(b)),
            ReduceOp::Min => fold::<$t>($acc, $x, pick_min),
            ReduceOp::Max => fold::<$t>($acc, $x, pick_max),
            ReduceOp::Band => fold::<$t>($acc, $x, |a, b| a & b),
            ReduceOp::Bor => fold::<$t>($acc, $x, |a, b| a | b),
            ReduceOp::Bxor => fold::<$t>($acc, $x, |a, b| a ^ b),
        }
    };
}

macro_rules! float_combine {
    ($t:ty, $op:expr, $acc:expr, $x:expr) => {
        match $op {
            ReduceOp::Sum => fold::<$t>($acc, $x, |a, b| a + b),
            ReduceOp::Prod => fold::<$t>($acc, $x, |a, b| a * b),
            ReduceOp::Min => fold::<$t>($acc, $x, pick_min),
            ReduceOp::Max => fold::<$t>($acc, $x, pick_max),
            // PANIC: combine() refuses bitwise operators on floats first.
            ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor => unreachable!("bitwise op on floats"),
        }
    };
}

/// Checks that `op` applies to `t` and that a vector of `len` bytes is whole
/// elements.
pub fn check(t: Dtype, op: ReduceOp, len: usize) -> Result<()> {
    if !op.defined_for(t) {
        return Err(Error::InvalidOp { dtype: t, op });
    }
    if !len.is_multiple_of(t.size()) {
        return Err(Error::InvalidArgument(format!("{len} bytes is not a whole number of {} elements", t.name())));
    }
    Ok(())
}

/// `acc[i] = acc[i] ⊕ x[i]` for every element (see the module table).
///
/// # Errors
/// [`Error::InvalidOp`] for a bitwise operator on floats;
/// [`Error::InvalidArgument`] if the lengths differ or are not whole elements.
pub fn combine(t: Dtype, op: ReduceOp, acc: &mut [u8], x: &[u8]) -> Result<()> {
    check(t, op, acc.len())?;
    if acc.len() != x.len() {
        return Err(Error::InvalidArgument(format!(
            "combine: accumulator of {} bytes, operand of {}",
            acc.len(),
            x.len()
        )));
    }
    match t {
        Dtype::I32 => int_combine!(i32, op, acc, x),
        Dtype::I64 => int_combine!(i64, op, acc, x),
        Dtype::U32 => int_combine!(u32, op, acc, x),
        Dtype::U64 => int_combine!(u64, op, acc, x),
        Dtype::F32 => float_combine!(f32, op, acc, x),
        Dtype::F64 => float_combine!(f64, op, acc, x),
    }
    Ok(())
}

/// Children of every rank of a parent array, ascending, after checking it
/// is one tree rooted at 0 (`parent[0]` is `None`, every other entry names
/// a rank, following parents always reaches 0).
pub fn children_of(parent: &[Option<u16>]) -> Result<Vec<Vec<u16>>> {
    let n = parent.len();
    let bad = |why: String| Err(Error::InvalidArgument(format!("parent array of {n} ranks: {why}")));
    if n == 0 || n > 1 << 16 {
        return bad("size must be 1..=65536".into());
    }
    if parent[0].is_some() {
        return bad("rank 0 must be the root".into());
    }
    let mut children = vec![Vec::new(); n];
    for (r, p) in parent.iter().enumerate().skip(1) {
        match *p {
            Some(p) if (p as usize) < n && p as usize != r => children[p as usize].push(r as u16),
            Some(p) => return bad(format!("rank {r} has parent {p}")),
            None => return bad(format!("rank {r} has no parent (two roots)")),
        }
    }
    // Every rank reachable from 0 ⇔ no cycle (n − 1 edges, all reached).
    let mut seen = vec![false; n];
    let mut stack = vec![0u16];
    let mut reached = 0;
    while let Some(r) = stack.pop() {
        seen[r as usize] = true;
        reached += 1;
        stack.extend(children[r as usize].iter().copied().filter(|&c| !seen[c as usize]));
    }
    if reached != n {
        return bad("a cycle cuts some ranks off from the root".into());
    }
    Ok(children)
}

/// What a reduction over the tree `parent` (relative ranks, root 0; e.g.
/// [`crate::tree::Tree::parent`]) computes when relative rank `i`
/// contributes `inputs[i]`: post-order, and at every rank
/// `acc = own; for c in children ascending: acc ⊕= subtree(c)`.
///
/// # Errors
/// As [`combine`], plus [`Error::InvalidArgument`] for a parent array that
/// is not a tree over `inputs.len()` ranks or inputs of different lengths.
pub fn reduce_ref(t: Dtype, op: ReduceOp, parent: &[Option<u16>], inputs: &[Vec<u8>]) -> Result<Vec<u8>> {
    if parent.len() != inputs.len() {
        return Err(Error::InvalidArgument(format!("{} inputs for a tree of {} ranks", inputs.len(), parent.len())));
    }
    let children = children_of(parent)?;
    let len = inputs[0].len();
    check(t, op, len)?;
    if let Some(r) = inputs.iter().position(|v| v.len() != len) {
        return Err(Error::InvalidArgument(format!("input {r} has {} bytes, input 0 has {len}", inputs[r].len())));
    }
    // Iterative post-order (a chain of 65 536 ranks must not overflow the
    // stack): a rank is finished once all its children are.
    let mut partial: Vec<Option<Vec<u8>>> = vec![None; inputs.len()];
    let mut stack: Vec<(u16, bool)> = vec![(0, false)];
    while let Some((r, expanded)) = stack.pop() {
        let kids = &children[r as usize];
        if !expanded {
            stack.push((r, true));
            stack.extend(kids.iter().rev().map(|&c| (c, false)));
            continue;
        }
        let mut acc = inputs[r as usize].clone();
        for &c in kids {
            // PANIC: post-order finished every child before its parent.
            let sub = partial[c as usize].take().expect("child finished first");
            combine(t, op, &mut acc, &sub)?;
        }
        partial[r as usize] = Some(acc);
    }
    Ok(partial[0].take().expect("the root is finished last"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Tree;
    use proptest::prelude::*;

    fn bytes<T: Elem>(v: &[T]) -> Vec<u8> {
        let mut out = vec![0u8; v.len() * T::SIZE];
        for (x, b) in v.iter().zip(out.chunks_exact_mut(T::SIZE)) {
            x.store(b);
        }
        out
    }

    fn values<T: Elem>(b: &[u8]) -> Vec<T> {
        b.chunks_exact(T::SIZE).map(T::load).collect()
    }

    fn comb<T: Elem>(t: Dtype, op: ReduceOp, a: &[T], x: &[T]) -> Vec<T> {
        let mut acc = bytes(a);
        combine(t, op, &mut acc, &bytes(x)).expect("defined");
        values(&acc)
    }

    #[test]
    fn integer_ops_wrap_and_respect_signedness() {
        assert_eq!(comb(Dtype::I32, ReduceOp::Sum, &[i32::MAX, -5], &[1, 2]), [i32::MIN, -3]);
        assert_eq!(comb(Dtype::U32, ReduceOp::Prod, &[0x8000_0000u32, 3], &[2, 5]), [0, 15]);
        assert_eq!(comb(Dtype::I64, ReduceOp::Prod, &[i64::MAX], &[2]), [-2]);
        assert_eq!(comb(Dtype::U64, ReduceOp::Sum, &[u64::MAX], &[2]), [1]);
        // The same bits order differently signed and unsigned.
        assert_eq!(comb(Dtype::I32, ReduceOp::Min, &[1i32, -1], &[-1, 1]), [-1, -1]);
        assert_eq!(comb(Dtype::U32, ReduceOp::Min, &[1u32, u32::MAX], &[u32::MAX, 1]), [1, 1]);
        assert_eq!(comb(Dtype::I64, ReduceOp::Max, &[i64::MIN, 7], &[-1, 7]), [-1, 7]);
        assert_eq!(comb(Dtype::U64, ReduceOp::Max, &[0u64], &[u64::MAX]), [u64::MAX]);
        assert_eq!(comb(Dtype::U32, ReduceOp::Band, &[0b1100u32], &[0b1010]), [0b1000]);
        assert_eq!(comb(Dtype::I32, ReduceOp::Bor, &[0b1100i32], &[0b1010]), [0b1110]);
        assert_eq!(comb(Dtype::U64, ReduceOp::Bxor, &[0b1100u64], &[0b1010]), [0b0110]);
        // Little-endian on the wire, whatever the host.
        let mut acc = vec![1, 0, 0, 0];
        combine(Dtype::U32, ReduceOp::Sum, &mut acc, &[0xFF, 0, 0, 0]).unwrap();
        assert_eq!(acc, [0, 1, 0, 0]);
    }

    #[test]
    fn float_min_max_keep_the_accumulator_on_nan_and_ties() {
        let nan = f64::NAN;
        assert_eq!(comb(Dtype::F64, ReduceOp::Min, &[1.0f64], &[nan]), [1.0]);
        assert_eq!(comb(Dtype::F64, ReduceOp::Max, &[1.0f64], &[nan]), [1.0]);
        assert!(comb(Dtype::F64, ReduceOp::Min, &[nan], &[1.0f64])[0].is_nan());
        assert!(comb(Dtype::F32, ReduceOp::Max, &[f32::NAN], &[1.0f32])[0].is_nan());
        // -0.0 == 0.0: neither is strictly less, so the accumulator stays.
        assert!(comb(Dtype::F64, ReduceOp::Min, &[0.0f64], &[-0.0])[0].is_sign_positive());
        assert!(comb(Dtype::F32, ReduceOp::Max, &[-0.0f32], &[0.0])[0].is_sign_negative());
        assert_eq!(comb(Dtype::F32, ReduceOp::Min, &[2.5f32, -1.0], &[-3.0, 4.0]), [-3.0, -1.0]);
        // One NaN operand of a sum: that NaN comes out (quiet, payload
        // kept, on x86-64 and aarch64 alike). Two NaNs: a NaN, but which
        // payload is the hardware's and the compiler's business (LLVM
        // treats fadd as commutative), so nothing promises more.
        let a = f64::from_bits(0x7FF8_0000_0000_0001);
        let b = f64::from_bits(0x7FF8_0000_0000_0002);
        assert_eq!(comb(Dtype::F64, ReduceOp::Sum, &[a], &[1.0])[0].to_bits(), a.to_bits());
        assert_eq!(comb(Dtype::F64, ReduceOp::Sum, &[1.0], &[a])[0].to_bits(), a.to_bits());
        assert!(comb(Dtype::F64, ReduceOp::Sum, &[a], &[b])[0].is_nan());
        assert_eq!(comb(Dtype::F64, ReduceOp::Sum, &[0.1f64], &[0.2])[0].to_bits(), (0.1f64 + 0.2).to_bits());
        assert_eq!(comb(Dtype::F32, ReduceOp::Prod, &[3.0f32], &[0.5])[0], 1.5);
    }

    #[test]
    fn bitwise_on_floats_and_bad_lengths_are_refused() {
        for t in [Dtype::F32, Dtype::F64] {
            for op in [ReduceOp::Band, ReduceOp::Bor, ReduceOp::Bxor] {
                let mut acc = vec![0u8; t.size()];
                match combine(t, op, &mut acc, &vec![0u8; t.size()]) {
                    Err(Error::InvalidOp { dtype, op: o }) => assert_eq!((dtype, o), (t, op)),
                    other => panic!("{t:?} {op:?}: {other:?}"),
                }
            }
        }
        let mut acc = vec![0u8; 8];
        assert!(matches!(combine(Dtype::I64, ReduceOp::Sum, &mut acc, &[0u8; 16]), Err(Error::InvalidArgument(_))));
        assert!(matches!(combine(Dtype::I32, ReduceOp::Sum, &mut acc[..6], &[0u8; 6]), Err(Error::InvalidArgument(_))));
        assert!(combine(Dtype::I32, ReduceOp::Sum, &mut [], &[]).is_ok());
    }

    #[test]
    fn bad_trees_are_refused() {
        let one = vec![vec![0u8; 8]; 3];
        for parent in [
            vec![Some(1), Some(0), Some(0)],
            vec![None, None, Some(0)],
            vec![None, Some(2), Some(1)],
            vec![None, Some(5), Some(0)],
        ] {
            assert!(
                matches!(reduce_ref(Dtype::I64, ReduceOp::Sum, &parent, &one), Err(Error::InvalidArgument(_))),
                "{parent:?}"
            );
        }
        assert!(reduce_ref(Dtype::I64, ReduceOp::Sum, &[None, Some(0)], &one).is_err(), "count mismatch");
        let ragged = vec![vec![0u8; 8], vec![0u8; 16]];
        assert!(reduce_ref(Dtype::I64, ReduceOp::Sum, &[None, Some(0)], &ragged).is_err());
        // A parent may have a higher rank than its child.
        assert_eq!(children_of(&[None, Some(2), Some(0)]).unwrap(), [vec![2], vec![], vec![1]]);
    }

    /// The fixed combining order over the 5-rank binomial tree
    /// (0→[1,2,4], 1→[3]), written out by hand: ((x0 + (x1 + x3)) + x2) + x4.
    #[test]
    fn float_fold_follows_the_tree_order() {
        let tree = Tree::binomial(5);
        assert_eq!(tree.children[0], [1, 2, 4]);
        assert_eq!(tree.children[1], [3]);
        let x = [1e16f64, 1.0, -1e16, 1.0, 3.0];
        let inputs: Vec<Vec<u8>> = x.iter().map(|v| bytes(&[*v])).collect();
        let got = values::<f64>(&reduce_ref(Dtype::F64, ReduceOp::Sum, &tree.parent, &inputs).unwrap())[0];
        let want = ((x[0] + (x[1] + x[3])) + x[2]) + x[4];
        assert_eq!(got.to_bits(), want.to_bits());
        // The order matters: a plain left fold gives another answer.
        let plain = x.iter().skip(1).fold(x[0], |a, b| a + b);
        assert_ne!(got.to_bits(), plain.to_bits(), "inputs chosen so that order shows");
        // f32 over a flat tree is the left fold in rank order.
        let flat: Vec<Option<u16>> = (0..4).map(|r| if r == 0 { None } else { Some(0) }).collect();
        let y = [1.0f32, 1e-8, 1e-8, 1e8];
        let got = values::<f32>(
            &reduce_ref(Dtype::F32, ReduceOp::Sum, &flat, &y.iter().map(|v| bytes(&[*v])).collect::<Vec<_>>()).unwrap(),
        )[0];
        assert_eq!(got.to_bits(), (((y[0] + y[1]) + y[2]) + y[3]).to_bits());
    }

    /// A recursive statement of the same order, to check the iterative one.
    fn subtree(t: Dtype, op: ReduceOp, children: &[Vec<u16>], inputs: &[Vec<u8>], r: usize) -> Vec<u8> {
        let mut acc = inputs[r].clone();
        for &c in &children[r] {
            combine(t, op, &mut acc, &subtree(t, op, children, inputs, c as usize)).unwrap();
        }
        acc
    }

    fn arb_tree() -> impl Strategy<Value = Vec<Option<u16>>> {
        (1usize..40).prop_flat_map(|n| {
            // parent[r] drawn below r, then ranks shuffled: any shape, any numbering.
            (proptest::collection::vec(any::<prop::sample::Index>(), n), Just(n)).prop_map(|(picks, n)| {
                let mut parent = vec![None];
                for (r, p) in picks.iter().enumerate().skip(1) {
                    parent.push(Some(p.index(r) as u16));
                }
                let perm: Vec<usize> = {
                    let mut v: Vec<usize> = (1..n).collect();
                    // Deterministic shuffle from the picks (keeps 0 the root).
                    for i in (1..v.len()).rev() {
                        v.swap(i, picks[i].index(i + 1));
                    }
                    std::iter::once(0).chain(v).collect()
                };
                let mut out = vec![None; n];
                for r in 1..n {
                    out[perm[r]] = parent[r].map(|p| perm[p as usize] as u16);
                }
                out
            })
        })
    }

    proptest! {
        #[test]
        fn integer_reductions_do_not_depend_on_the_tree(parent in arb_tree(), seed in any::<u64>(), count in 0usize..6) {
            let n = parent.len();
            for t in [Dtype::I32, Dtype::I64, Dtype::U32, Dtype::U64] {
                for op in ReduceOp::ALL {
                    let mut x = seed | 1;
                    let inputs: Vec<Vec<u8>> = (0..n).map(|_| (0..count * t.size()).map(|_| {
                        x ^= x << 13; x ^= x >> 7; x ^= x << 17; x as u8
                    }).collect()).collect();
                    let mut plain = inputs[0].clone();
                    for v in &inputs[1..] {
                        combine(t, op, &mut plain, v).unwrap();
                    }
                    prop_assert_eq!(reduce_ref(t, op, &parent, &inputs).unwrap(), plain, "{:?} {:?}", t, op);
                }
            }
        }

        #[test]
        fn float_reductions_follow_the_fixed_order(parent in arb_tree(), vals in proptest::collection::vec(any::<f64>(), 40)) {
            let n = parent.len();
            let children = children_of(&parent).unwrap();
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
                let d: Vec<Vec<u8>> = vals[..n].iter().map(|v| bytes(&[*v, -*v * 0.5])).collect();
                let want = subtree(Dtype::F64, op, &children, &d, 0);
                prop_assert_eq!(reduce_ref(Dtype::F64, op, &parent, &d).unwrap(), want);
                let s: Vec<Vec<u8>> = vals[..n].iter().map(|v| bytes(&[*v as f32])).collect();
                let want = subtree(Dtype::F32, op, &children, &s, 0);
                prop_assert_eq!(reduce_ref(Dtype::F32, op, &parent, &s).unwrap(), want);
            }
        }
    }

    #[test]
    fn deep_chain_does_not_overflow_the_stack() {
        let n = 65_536;
        let parent: Vec<Option<u16>> = (0..n).map(|r| if r == 0 { None } else { Some(r as u16 - 1) }).collect();
        let inputs = vec![1u64.to_le_bytes().to_vec(); n];
        let got = reduce_ref(Dtype::U64, ReduceOp::Sum, &parent, &inputs).unwrap();
        assert_eq!(u64::from_le_bytes(got.try_into().unwrap()), n as u64);
    }
}
