//! SPEC stage 1: rank order with id tie-break, the normaliser, eligibility, rejection.

use ddtree_core::candidates::{candidates, NonFinite};
use ddtree_core::logits::Logits3;
use half::bf16;

type Ran = (Vec<f32>, Vec<i64>, Result<(usize, f32), NonFinite>);

fn run(x: &[f32], k: usize) -> Ran {
    let view = Logits3::new("x", x, [1, 1, x.len()], [x.len(), x.len(), 1]).unwrap();
    let (mut lp, mut ti) = (vec![0f32; k], vec![0i64; k]);
    let r = candidates(view.row(0, 0), &mut lp, &mut ti).map(|c| (c.eligible, c.z));
    (lp, ti, r)
}

#[test]
fn equal_values_rank_by_id() {
    let (_, ti, _) = run(&[1.0, 3.0, 3.0, 2.0, 3.0], 4);
    assert_eq!(ti, vec![1, 2, 4, 3]);
}

#[test]
fn negative_zero_ties_with_zero() {
    let (_, ti, _) = run(&[-1.0, -0.0, 0.0, -0.0], 3);
    assert_eq!(ti, vec![1, 2, 3]);
}

#[test]
fn normaliser_is_float64_logsumexp_rounded_once() {
    let x = [0.5f32, -1.25, 2.0, 2.0];
    let (lp, _, r) = run(&x, 2);
    let m = 2.0f64;
    let z = (m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()) as f32;
    assert_eq!(r.unwrap(), (2, z));
    assert_eq!(lp, vec![2.0f32 - z, 2.0f32 - z]);
}

#[test]
fn minus_infinity_is_never_eligible_and_fills_by_id() {
    let ninf = f32::NEG_INFINITY;
    let (lp, ti, r) = run(&[ninf, 1.0, ninf, ninf, 0.0], 4);
    assert_eq!(r.unwrap().0, 2);
    assert_eq!(ti, vec![1, 4, 0, 2]);
    assert_eq!(&lp[2..], &[ninf, ninf]);
    let (_, ti, r) = run(&[ninf; 3], 2);
    assert_eq!(r.unwrap(), (0, ninf));
    assert_eq!(ti, vec![0, 1]);
}

#[test]
fn nan_and_plus_infinity_reject_the_row() {
    assert_eq!(run(&[0.0, f32::NAN], 1).2, Err(NonFinite));
    assert_eq!(run(&[f32::INFINITY, 0.0], 1).2, Err(NonFinite));
}

#[test]
fn strided_bf16_rows_read_the_right_elements() {
    // A [1, 2, 3] view with vocabulary stride 2 over 12 bf16 values.
    let raw: Vec<bf16> = (0..12).map(|i| bf16::from_f32(i as f32)).collect();
    let view = Logits3::new("x", &raw, [1, 2, 3], [12, 6, 2]).unwrap();
    let (mut lp, mut ti) = (vec![0f32; 3], vec![0i64; 3]);
    candidates(view.row(0, 1), &mut lp, &mut ti).unwrap();
    // Row 1 holds elements 6, 8, 10 → values 6, 8, 10.
    assert_eq!(ti, vec![2, 1, 0]);
    assert!(Logits3::new("x", &raw, [1, 2, 4], [12, 6, 2]).is_err());
}
