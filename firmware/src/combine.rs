//! Element-wise reduction on little-endian vectors, as the NIC runs it
//! (seed 001 ch. 4; the paper used SoftFloat on the LANai, we have an FPU).
//!
//! Integer sum and product wrap. `min`/`max` replace the accumulator only
//! when the other value compares strictly less/greater, so a NaN never
//! displaces a number and every run gives the same bits. The caller fixes
//! the combining order (own value, then children in ascending rank).

use emp_uapi::coll::{Dtype, ReduceOp};

macro_rules! fold {
    ($t:ty, $acc:expr, $x:expr, $f:expr) => {{
        const W: usize = core::mem::size_of::<$t>();
        for (a, b) in $acc.chunks_exact_mut(W).zip($x.chunks_exact(W)) {
            let va = <$t>::from_le_bytes(a.try_into().expect("chunk of W"));
            let vb = <$t>::from_le_bytes(b.try_into().expect("chunk of W"));
            let f: fn($t, $t) -> $t = $f;
            a.copy_from_slice(&f(va, vb).to_le_bytes());
        }
    }};
}

macro_rules! int_ops {
    ($t:ty, $acc:expr, $x:expr, $op:expr) => {
        match $op {
            ReduceOp::Sum => fold!($t, $acc, $x, |a, b| a.wrapping_add(b)),
            ReduceOp::Prod => fold!($t, $acc, $x, |a, b| a.wrapping_mul(b)),
            ReduceOp::Min => fold!($t, $acc, $x, |a, b| if b < a { b } else { a }),
            ReduceOp::Max => fold!($t, $acc, $x, |a, b| if b > a { b } else { a }),
            ReduceOp::Band => fold!($t, $acc, $x, |a, b| a & b),
            ReduceOp::Bor => fold!($t, $acc, $x, |a, b| a | b),
            ReduceOp::Bxor => fold!($t, $acc, $x, |a, b| a ^ b),
        }
    };
}

macro_rules! float_ops {
    ($t:ty, $acc:expr, $x:expr, $op:expr) => {
        match $op {
            ReduceOp::Sum => fold!($t, $acc, $x, |a, b| a + b),
            ReduceOp::Prod => fold!($t, $acc, $x, |a, b| a * b),
            ReduceOp::Min => fold!($t, $acc, $x, |a, b| if b < a { b } else { a }),
            ReduceOp::Max => fold!($t, $acc, $x, |a, b| if b > a { b } else { a }),
            ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor => return false,
        }
    };
}

/// `acc[i] = acc[i] ⊕ x[i]` for every element. Returns false (and leaves
/// `acc` alone) when `op` is undefined for `t` or the lengths differ or are
/// not a multiple of the element size.
pub(crate) fn combine(t: Dtype, op: ReduceOp, acc: &mut [u8], x: &[u8]) -> bool {
    if acc.len() != x.len() || acc.len() % t.size() != 0 || !op.defined_for(t) {
        return false;
    }
    match t {
        Dtype::I32 => int_ops!(i32, acc, x, op),
        Dtype::I64 => int_ops!(i64, acc, x, op),
        Dtype::U32 => int_ops!(u32, acc, x, op),
        Dtype::U64 => int_ops!(u64, acc, x, op),
        Dtype::F32 => float_ops!(f32, acc, x, op),
        Dtype::F64 => float_ops!(f64, acc, x, op),
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le<T: Copy, const W: usize>(v: &[T], f: fn(T) -> [u8; W]) -> Vec<u8> {
        v.iter().flat_map(|&x| f(x)).collect()
    }

    #[test]
    fn integer_ops_wrap_and_compare() {
        let mut a = le(&[i32::MAX, -5, 7], i32::to_le_bytes);
        assert!(combine(Dtype::I32, ReduceOp::Sum, &mut a, &le(&[1, 5, 1], i32::to_le_bytes)));
        assert_eq!(a, le(&[i32::MIN, 0, 8], i32::to_le_bytes));
        let mut m = le(&[3u64, 9], u64::to_le_bytes);
        assert!(combine(Dtype::U64, ReduceOp::Min, &mut m, &le(&[5u64, 2], u64::to_le_bytes)));
        assert_eq!(m, le(&[3u64, 2], u64::to_le_bytes));
        let mut x = le(&[0b1100u32], u32::to_le_bytes);
        assert!(combine(Dtype::U32, ReduceOp::Bxor, &mut x, &le(&[0b1010u32], u32::to_le_bytes)));
        assert_eq!(x, le(&[0b0110u32], u32::to_le_bytes));
    }

    #[test]
    fn floats_keep_the_accumulator_against_nan_and_refuse_bitwise() {
        let mut a = le(&[1.0f64, f64::NAN], f64::to_le_bytes);
        assert!(combine(Dtype::F64, ReduceOp::Max, &mut a, &le(&[f64::NAN, 2.0], f64::to_le_bytes)));
        let v: Vec<f64> = a.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(v[0], 1.0, "NaN does not replace a number");
        assert!(v[1].is_nan(), "comparisons with a NaN accumulator are false");
        let before = a.clone();
        assert!(!combine(Dtype::F64, ReduceOp::Band, &mut a, &before.clone()));
        assert_eq!(a, before);
        assert!(!combine(Dtype::I64, ReduceOp::Sum, &mut a, &before[..8]), "length mismatch refused");
    }
}
