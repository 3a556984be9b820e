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
    // the first call reads the header back before its launch (and, decoding a blocked stream,
    // sets the guess); the later ones launch before the header is back
    gpu.decode_guess = None;
    let mut d_acc = s.clone_htod(&base).map_err(|e| format!("htod: {e:?}"))?;
    gpu.decompress_add_device(&d_stream.as_view(), &mut d_acc.as_view_mut())
        .map_err(|e| format!("gpu decompress_add: {e}"))?;
    let in_place = s.clone_dtoh(&d_acc).map_err(|e| format!("dtoh: {e:?}"))?;
    let mut d_again = s.clone_htod(&base).map_err(|e| format!("htod: {e:?}"))?;
    gpu.decompress_add_device(&d_stream.as_view(), &mut d_again.as_view_mut())
        .map_err(|e| format!("gpu decompress_add (guessed): {e}"))?;
    let again = s.clone_dtoh(&d_again).map_err(|e| format!("dtoh: {e:?}"))?;
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
    for (form, got) in [
        ("in place", &in_place),
        ("in place again", &again),
        ("to", &to),
    ] {
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

/// Device copies for the range checks below.
fn htod<T: cudarc::driver::DeviceRepr>(
    gpu: &GpuCodec,
    v: &[T],
) -> Result<cudarc::driver::CudaSlice<T>, String> {
    gpu.stream()
        .clone_htod(v)
        .map_err(|e| format!("htod: {e:?}"))
}

/// A zeroed output buffer of `compress_bound` bytes for `n` values of `T`.
fn stream_buffer<T: GpuElement>(
    gpu: &GpuCodec,
    n: usize,
) -> Result<cudarc::driver::CudaSlice<u8>, String> {
    gpu.stream()
        .alloc_zeros::<u8>(crate::format::HEADER_LEN + n * T::SIZE)
        .map_err(|e| format!("alloc: {e:?}"))
}

/// [`GpuCodec::compress_device_tracking`] of `data` against [`GpuCodec::compress_device`] under
/// `abs:abs_bound`: the same stream bytes, and, when it reports the range as tracked, an
/// accumulator that read back equals [`crate::quant::finite_range`] of `data`; untracked, the
/// accumulator stays empty. Returns whether it tracked.
pub fn check_tracked_compress<T: GpuElement>(
    gpu: &mut GpuCodec,
    data: &[T],
    abs_bound: f64,
    codec: CodecKind,
) -> Result<bool, String> {
    let label = format!("{codec} {} n={} abs:{abs_bound:e}", T::DTYPE, data.len());
    let s = gpu.stream().clone();
    let d_in = htod(gpu, data)?;
    let mut d_a = stream_buffer::<T>(gpu, data.len())?;
    let mut d_b = stream_buffer::<T>(gpu, data.len())?;
    let len_a = gpu
        .compress_device(
            &d_in.as_view(),
            ErrorBound::Abs(abs_bound),
            codec,
            &mut d_a.as_view_mut(),
        )
        .map_err(|e| format!("{label}: compress_device: {e}"))?;
    let mut acc = super::DeviceRange::new(&s).map_err(|e| format!("{label}: range: {e}"))?;
    let (len_b, tracked) = gpu
        .compress_device_tracking(
            &d_in.as_view(),
            abs_bound,
            codec,
            &mut d_b.as_view_mut(),
            &mut acc,
        )
        .map_err(|e| format!("{label}: compress_device_tracking: {e}"))?;
    let a = s
        .clone_dtoh(&d_a.slice(..len_a))
        .map_err(|e| format!("dtoh: {e:?}"))?;
    let b = s
        .clone_dtoh(&d_b.slice(..len_b))
        .map_err(|e| format!("dtoh: {e:?}"))?;
    if a != b {
        let at = a.iter().zip(&b).position(|(x, y)| x != y);
        return Err(format!(
            "{label}: the tracking stream differs ({len_a} vs {len_b} bytes, first difference at \
             {at:?})"
        ));
    }
    tracked_range_is(&acc, &s, &label, tracked, data)
}

/// Two ranges equal bit for bit (so that `-0.0` and `+0.0` differ).
pub fn same_range(a: Option<(f64, f64)>, b: Option<(f64, f64)>) -> bool {
    match (a, b) {
        (Some((a0, a1)), Some((b0, b1))) => {
            a0.to_bits() == b0.to_bits() && a1.to_bits() == b1.to_bits()
        }
        (None, None) => true,
        _ => false,
    }
}

/// [`GpuCodec::decompress_add_to_device_tracking`] of `stream` onto `base` against
/// [`GpuCodec::decompress_add_to_device`]: the same result bits (`out` starting as NaN in both),
/// and, when it reports the range as tracked, an accumulator equal to
/// [`crate::quant::finite_range`] of `base`; untracked, the accumulator stays empty. Returns
/// whether it tracked.
pub fn check_tracked_decompress_add<T: GpuElement>(
    gpu: &mut GpuCodec,
    stream: &[u8],
    base: &[T],
) -> Result<bool, String> {
    let h = crate::inspect(stream).map_err(|e| format!("inspect: {e}"))?;
    let label = format!(
        "{} {} n={} {:?}{}",
        CodecKind::from_tag(h.codec).map_err(|e| e.to_string())?,
        T::DTYPE,
        base.len(),
        h.mode,
        if h.is_stored() { " stored" } else { "" }
    );
    let s = gpu.stream().clone();
    let d_stream = htod(gpu, stream)?;
    let d_base = htod(gpu, base)?;
    let garbage = vec![T::from_f64(f64::NAN); base.len()];
    let mut d_a = htod(gpu, &garbage)?;
    let mut d_b = htod(gpu, &garbage)?;
    gpu.decompress_add_to_device(
        &d_stream.as_view(),
        &d_base.as_view(),
        &mut d_a.as_view_mut(),
    )
    .map_err(|e| format!("{label}: decompress_add_to_device: {e}"))?;
    let mut acc = super::DeviceRange::new(&s).map_err(|e| format!("{label}: range: {e}"))?;
    let tracked = gpu
        .decompress_add_to_device_tracking(
            &d_stream.as_view(),
            &d_base.as_view(),
            &mut d_b.as_view_mut(),
            &mut acc,
        )
        .map_err(|e| format!("{label}: decompress_add_to_device_tracking: {e}"))?;
    let a = s.clone_dtoh(&d_a).map_err(|e| format!("dtoh: {e:?}"))?;
    let b = s.clone_dtoh(&d_b).map_err(|e| format!("dtoh: {e:?}"))?;
    if let Some(i) = a
        .iter()
        .zip(&b)
        .position(|(x, y)| x.to_bits_u64() != y.to_bits_u64())
    {
        return Err(format!("{label}: value {i}: {:?} vs {:?}", a[i], b[i]));
    }
    tracked_range_is(&acc, &s, &label, tracked, base)
}

/// `acc` holds `values`' finite range when the call `tracked` it, and nothing otherwise;
/// returns `tracked`.
fn tracked_range_is<T: GpuElement>(
    acc: &super::DeviceRange,
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
    label: &str,
    tracked: bool,
    values: &[T],
) -> Result<bool, String> {
    let got = acc.read(s).map_err(|e| format!("{label}: read: {e}"))?;
    let want = if tracked {
        crate::quant::finite_range(values)
    } else {
        None
    };
    if !same_range(got, want) {
        return Err(format!(
            "{label} (tracked {tracked}): range {got:?}, want {want:?}"
        ));
    }
    Ok(tracked)
}

/// [`GpuCodec::sampled_range_device`] of `data` against [`crate::quant::sampled_range`].
pub fn check_sampled_range<T: GpuElement>(gpu: &mut GpuCodec, data: &[T]) -> Result<(), String> {
    let d = htod(gpu, data)?;
    let got = gpu
        .sampled_range_device(&d.as_view())
        .map_err(|e| format!("sampled_range_device: {e}"))?;
    let want = crate::quant::sampled_range(data);
    if !same_range(got, want) {
        return Err(format!(
            "{} n={}: sampled range {got:?}, want {want:?}",
            T::DTYPE,
            data.len()
        ));
    }
    Ok(())
}

/// [`GpuCodec::compress_reconstruct_device`] on the sum `base + decoded incoming` (formed by
/// [`GpuCodec::decompress_add_to_device`]) against [`GpuCodec::reduce_step_device`] with
/// reconstruction (divisor 1) on the same operands: both decline or neither does, and then the
/// same stream bytes and the same reconstruction bits. `Ok(Some(len))`: the stream's length;
/// `Ok(None)`: both declined.
pub fn check_compress_reconstruct<T: GpuElement>(
    gpu: &mut GpuCodec,
    incoming: &[u8],
    base: &[T],
    codec: CodecKind,
    abs_bound: f64,
) -> Result<Option<usize>, String> {
    let label = format!("{codec} {} n={} abs:{abs_bound:e}", T::DTYPE, base.len());
    let s = gpu.stream().clone();
    let n = base.len();
    let d_in = htod(gpu, incoming)?;
    let d_base = htod(gpu, base)?;
    let garbage = vec![T::from_f64(f64::NAN); n];
    let mut d_acc_a = htod(gpu, &garbage)?;
    let mut d_acc_b = htod(gpu, &garbage)?;
    let mut d_a = stream_buffer::<T>(gpu, n)?;
    let mut d_b = stream_buffer::<T>(gpu, n)?;
    let enc = super::StepEncoding {
        codec,
        abs_bound,
        divisor: 1.0,
        reconstruct: true,
    };
    let a = gpu
        .reduce_step_device(
            &d_in.as_view(),
            &d_base.as_view(),
            &mut d_acc_a.as_view_mut(),
            enc,
            &mut d_a.as_view_mut(),
        )
        .map_err(|e| format!("{label}: reduce_step_device: {e}"))?;
    gpu.decompress_add_to_device(
        &d_in.as_view(),
        &d_base.as_view(),
        &mut d_acc_b.as_view_mut(),
    )
    .map_err(|e| format!("{label}: decompress_add_to_device: {e}"))?;
    let b = gpu
        .compress_reconstruct_device(
            &mut d_acc_b.as_view_mut(),
            codec,
            abs_bound,
            &mut d_b.as_view_mut(),
        )
        .map_err(|e| format!("{label}: compress_reconstruct_device: {e}"))?;
    let (la, lb) = match (a, b) {
        (Some(la), Some(lb)) => (la, lb),
        // reduce_step stores an incompressible sum itself; compress_reconstruct declines it
        (Some(la), None) if la == crate::format::HEADER_LEN + n * T::SIZE => return Ok(None),
        (None, None) => return Ok(None),
        _ => {
            return Err(format!(
                "{label}: reduce_step {a:?} vs compress_reconstruct {b:?}"
            ))
        }
    };
    let sa = s
        .clone_dtoh(&d_a.slice(..la))
        .map_err(|e| format!("dtoh: {e:?}"))?;
    let sb = s
        .clone_dtoh(&d_b.slice(..lb))
        .map_err(|e| format!("dtoh: {e:?}"))?;
    if sa != sb {
        let at = sa.iter().zip(&sb).position(|(x, y)| x != y);
        return Err(format!(
            "{label}: streams differ ({la} vs {lb} bytes, first difference at {at:?})"
        ));
    }
    let ra = s.clone_dtoh(&d_acc_a).map_err(|e| format!("dtoh: {e:?}"))?;
    let rb = s.clone_dtoh(&d_acc_b).map_err(|e| format!("dtoh: {e:?}"))?;
    if let Some(i) = ra
        .iter()
        .zip(&rb)
        .position(|(x, y)| x.to_bits_u64() != y.to_bits_u64())
    {
        return Err(format!(
            "{label}: reconstruction value {i}: {:?} vs {:?}",
            ra[i], rb[i]
        ));
    }
    Ok(Some(la))
}

/// Decodes queued without waiting (the crate's `GpuCodec::decompress_add_to_device_queued`
/// and `decompress_device_queued`), more of them at once than there are result slots,
/// then each settled: every one whose stream is a compressed `codec` stream equals the waiting
/// call's result bit for bit (sums, decoded values, and the base's range where tracked); a
/// stored stream (the guess is wrong) is reported as not decoded with nothing written; a
/// corrupted one is rejected, without disturbing the decodes queued behind it. `data` must
/// compress under `bound` (f32 values).
pub fn check_queued_decodes(
    gpu: &mut GpuCodec,
    data: &[f32],
    bound: ErrorBound,
    codec: CodecKind,
) -> Result<(), String> {
    use super::Decode;
    let n = data.len();
    let good = crate::compress(data, bound, codec).map_err(|e| format!("compress: {e}"))?;
    let back: Vec<f32> = crate::decompress(&good).map_err(|e| format!("decompress: {e}"))?;
    let noise: Vec<f32> = (0..n)
        .map(|i| ((i as u64 + 7).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as f32)
        .collect();
    let stored = crate::compress(&noise, ErrorBound::Abs(1e-9), codec)
        .map_err(|e| format!("compress noise: {e}"))?;
    if !crate::inspect(&stored)
        .map_err(|e| e.to_string())?
        .is_stored()
    {
        return Err("the noise stream is not stored".into());
    }
    let mut bad = good.clone();
    let k = good.len() - 9;
    bad[k] ^= 0x20;
    let base: Vec<f32> = (0..n).map(|i| (i % 29) as f32 - 14.0).collect();
    let s = gpu.stream().clone();
    let e = |e: cudarc::driver::DriverError| format!("{e:?}");
    let d_base = htod(gpu, &base)?;
    // 20 calls (> the 16 slots): good ones added (every third tracked) or decoded, a stored
    // and a corrupted stream among them
    let kinds: Vec<&str> = (0..20)
        .map(|j| match j {
            5 => "stored",
            11 => "corrupted",
            j if j % 2 == 0 => "add",
            _ => "decode",
        })
        .collect();
    let streams = [&good, &stored, &bad];
    let d_streams: Vec<_> = streams
        .iter()
        .map(|x| htod(gpu, x))
        .collect::<Result<_, _>>()?;
    let mut outs = Vec::new();
    let mut ranges = Vec::new();
    let mut calls = Vec::new();
    for (j, kind) in kinds.iter().enumerate() {
        let which = match *kind {
            "stored" => 1,
            "corrupted" => 2,
            _ => 0,
        };
        let mut o = s.clone_htod(&vec![f32::NAN; n]).map_err(e)?;
        let st = d_streams[which].as_view();
        let tracked = j % 3 == 0 && *kind != "decode";
        let mut range = super::DeviceRange::new(&s).map_err(|e| e.to_string())?;
        let expected = (codec, bound.mode());
        let r = if *kind == "decode" {
            gpu.decompress_device_queued(&st, &mut o.as_view_mut(), expected)
        } else {
            let track = tracked.then_some(&mut range);
            let base = d_base.as_view();
            gpu.decompress_add_to_device_queued(&st, &base, &mut o.as_view_mut(), track, expected)
        };
        calls.push(r);
        outs.push(o);
        ranges.push((tracked, range));
    }
    let mut queued_any = false;
    for (j, r) in calls.into_iter().enumerate() {
        let kind = kinds[j];
        // Some(tracked): decoded; None: the guess was wrong, nothing written
        let settled = match r {
            Ok(Decode::Queued(q)) => {
                queued_any = true;
                gpu.settle::<f32>(q)
            }
            Ok(Decode::Done { tracked }) => Ok(Some(tracked)),
            Err(e) => Err(e),
        };
        let got = s.clone_dtoh(&outs[j]).map_err(e)?;
        match (kind, settled) {
            ("corrupted", Err(_)) => {}
            ("corrupted", r) => return Err(format!("call {j}: a corrupted stream gave {r:?}")),
            ("stored", Ok(None)) => {
                if got.iter().any(|v| !v.is_nan()) {
                    return Err(format!("call {j}: a wrong guess wrote values"));
                }
            }
            ("stored", Ok(Some(_))) => {
                // ran the waiting way (no free slot): the exact values added
                let want = noise.iter().zip(&base).map(|(x, b)| b + x);
                if want.zip(&got).any(|(w, g)| w.to_bits() != g.to_bits()) {
                    return Err(format!("call {j}: stored stream added wrongly"));
                }
            }
            (_, Ok(Some(tracked))) => {
                let want: Vec<f32> = if kind == "decode" {
                    back.clone()
                } else {
                    back.iter().zip(&base).map(|(x, b)| b + x).collect()
                };
                if want
                    .iter()
                    .zip(&got)
                    .any(|(w, g)| w.to_bits() != g.to_bits())
                {
                    return Err(format!("call {j} ({kind}): values differ"));
                }
                let (asked, range) = &mut ranges[j];
                if tracked != *asked && kind != "decode" {
                    return Err(format!("call {j}: tracked {tracked}, asked {asked}"));
                }
                if tracked {
                    let got = range.read(&s).map_err(|e| e.to_string())?;
                    if !same_range(got, crate::quant::finite_range(&base)) {
                        return Err(format!("call {j}: range {got:?}"));
                    }
                }
            }
            (_, r) => return Err(format!("call {j} ({kind}): {r:?}")),
        }
    }
    if !queued_any {
        return Err("nothing was queued".into());
    }
    Ok(())
}
