//! Checks shared by the GPU tests (the library's unit tests and `tests/gpu.rs`). Not a stable API.

use super::{GpuCodec, GpuElement};
use crate::codec::CodecKind;
use crate::quant::ErrorBound;

/// Compresses `data` with the CPU twin, decompresses the stream on the GPU onto a fixed
/// accumulator with [`GpuCodec::decompress_add_device`] (in place) and
/// [`GpuCodec::decompress_add_to_device`] (a separate base, `out` starting as NaN), checks that
/// the base is left unchanged, and compares every value of both with `add`
/// (the dtype's own IEEE addition) of the accumulator and the CPU reconstruction; two non-finite
/// values count as equal (NaN payloads of a sum are not unique). `Err` names the first mismatch
/// or the failing step.
pub fn check_decompress_add<T: GpuElement>(
    gpu: &mut GpuCodec,
    data: &[T],
    bound: ErrorBound,
    codec: CodecKind,
    add: impl Fn(T, T) -> T,
) -> Result<(), String> {
    let stream = crate::compress(data, bound, codec).map_err(|e| format!("cpu compress: {e}"))?;
    let back: Vec<T> = crate::decompress(&stream).map_err(|e| format!("cpu decompress: {e}"))?;
    let base: Vec<T> = (0..data.len())
        .map(|i| T::from_f64((i % 97) as f64 * 0.25 - 3.0))
        .collect();
    let s = gpu.stream().clone();
    let d_stream = s.clone_htod(&stream).map_err(|e| format!("htod: {e:?}"))?;
    let mut d_acc = s.clone_htod(&base).map_err(|e| format!("htod: {e:?}"))?;
    gpu.decompress_add_device(&d_stream.as_view(), &mut d_acc.as_view_mut())
        .map_err(|e| format!("gpu decompress_add: {e}"))?;
    let in_place = s.clone_dtoh(&d_acc).map_err(|e| format!("dtoh: {e:?}"))?;
    // the three-operand form: the base stays, `out` starts as garbage (NaN everywhere)
    let d_base = s.clone_htod(&base).map_err(|e| format!("htod: {e:?}"))?;
    let garbage = vec![T::from_f64(f64::NAN); data.len()];
    let mut d_out = s.clone_htod(&garbage).map_err(|e| format!("htod: {e:?}"))?;
    gpu.decompress_add_to_device(
        &d_stream.as_view(),
        &d_base.as_view(),
        &mut d_out.as_view_mut(),
    )
    .map_err(|e| format!("gpu decompress_add_to: {e}"))?;
    let to = s.clone_dtoh(&d_out).map_err(|e| format!("dtoh: {e:?}"))?;
    let kept = s.clone_dtoh(&d_base).map_err(|e| format!("dtoh: {e:?}"))?;
    if kept
        .iter()
        .zip(&base)
        .any(|(a, b)| a.to_bits_u64() != b.to_bits_u64())
    {
        return Err(format!(
            "{codec} {bound}: decompress_add_to changed its base"
        ));
    }
    for (form, got) in [("in place", &in_place), ("to", &to)] {
        for (i, ((&x, &a), &g)) in back.iter().zip(&base).zip(got).enumerate() {
            let want = add(a, x);
            if want.to_bits_u64() != g.to_bits_u64() && (want.finite() || g.finite()) {
                return Err(format!(
                    "{codec} {bound} {} value {i} ({form}): {want:?} vs {g:?}",
                    T::DTYPE
                ));
            }
        }
    }
    Ok(())
}

/// One fused ring step ([`GpuCodec::reduce_step_device`]) on `incoming` (a CPU stream of `n`
/// values) and `base`, against the separate CPU steps: `sum = base + decoded` (one rounding per
/// value, `add`), divided by `divisor` (`div`) unless it is 1, compressed by the CPU twin under
/// `abs_bound`; the GPU's stream must equal that stream byte for byte, and its accumulator the
/// CPU's decode of it (`reconstruct`) or the sum. `Ok(false)`: the GPU declined to fuse.
#[allow(clippy::too_many_arguments)]
pub fn check_reduce_step<T: GpuElement>(
    gpu: &mut GpuCodec,
    incoming: &[u8],
    base: &[T],
    codec: CodecKind,
    abs_bound: f64,
    divisor: f64,
    reconstruct: bool,
    (add, div): (impl Fn(T, T) -> T, impl Fn(T, T) -> T),
) -> Result<bool, String> {
    let x: Vec<T> = crate::decompress(incoming).map_err(|e| format!("cpu decompress: {e}"))?;
    let d = T::from_f64(divisor);
    let sum: Vec<T> = base
        .iter()
        .zip(&x)
        .map(|(&a, &v)| {
            let s = add(a, v);
            if divisor == 1.0 {
                s
            } else {
                div(s, d)
            }
        })
        .collect();
    let want = crate::compress(&sum, ErrorBound::Abs(abs_bound), codec)
        .map_err(|e| format!("cpu compress: {e}"))?;
    let kept: Vec<T> = if reconstruct {
        crate::decompress(&want).map_err(|e| format!("cpu decompress: {e}"))?
    } else {
        sum
    };
    let s = gpu.stream().clone();
    let d_in = s.clone_htod(incoming).map_err(|e| format!("htod: {e:?}"))?;
    let d_base = s.clone_htod(base).map_err(|e| format!("htod: {e:?}"))?;
    let garbage = vec![T::from_f64(f64::NAN); base.len()];
    let mut d_acc = s.clone_htod(&garbage).map_err(|e| format!("htod: {e:?}"))?;
    let mut d_out = s
        .alloc_zeros::<u8>(crate::format::HEADER_LEN + base.len() * T::SIZE)
        .map_err(|e| format!("alloc: {e:?}"))?;
    let enc = super::StepEncoding {
        codec,
        abs_bound,
        divisor,
        reconstruct,
    };
    let got = gpu
        .reduce_step_device(
            &d_in.as_view(),
            &d_base.as_view(),
            &mut d_acc.as_view_mut(),
            enc,
            &mut d_out.as_view_mut(),
        )
        .map_err(|e| format!("gpu reduce_step: {e}"))?;
    let Some(len) = got else {
        return Ok(false);
    };
    let label = format!("{codec} {} abs:{abs_bound:e} /{divisor}", T::DTYPE);
    let stream = s
        .clone_dtoh(&d_out.slice(..len))
        .map_err(|e| format!("dtoh: {e:?}"))?;
    if stream != want {
        let at = stream.iter().zip(&want).position(|(a, b)| a != b);
        return Err(format!(
            "{label}: stream differs from the CPU's ({} vs {} bytes, first difference at {at:?})",
            stream.len(),
            want.len()
        ));
    }
    let acc = s.clone_dtoh(&d_acc).map_err(|e| format!("dtoh: {e:?}"))?;
    for (i, (g, w)) in acc.iter().zip(&kept).enumerate() {
        if g.to_bits_u64() != w.to_bits_u64() && (g.finite() || w.finite()) {
            return Err(format!(
                "{label} (reconstruct {reconstruct}) value {i}: {g:?} vs {w:?}"
            ));
        }
    }
    Ok(true)
}
