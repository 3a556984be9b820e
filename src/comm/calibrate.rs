//! [`Communicator::calibrate`]: measures the link and the codecs and fills the shared
//! [`Profile`].

use super::link_calibrate::{self, LinkPattern, PairLink};
use super::*;

impl Communicator {
    pub(super) fn setup_profile(&mut self) -> Result<()> {
        let key = format!("{}-p{}-{}", hostname(), self.size(), self.compressor.name());
        let path = self
            .config
            .profile_path
            .clone()
            .unwrap_or_else(|| Profile::default_path(&key));
        match self.config.calibration.clone() {
            Calibration::Fixed(p) => {
                self.profile = p;
                return Ok(());
            }
            Calibration::LoadOrMeasure => {
                // rank 0 reads the file; everybody gets its bytes (empty: none).
                let mut bytes = if self.rank() == 0 {
                    std::fs::read(&path).unwrap_or_default()
                } else {
                    Vec::new()
                };
                self.transport.bcast(0, &mut bytes)?;
                if !bytes.is_empty() {
                    if let Some(p) = Profile::from_cache(&bytes, &path) {
                        if p.ranks == self.size()
                            && p.compressor == self.compressor.name()
                            && self.cached_link_fits(&p, &path)?
                        {
                            tracing::debug!(target: "zcomm::comm", path = %path.display(), "loaded profile");
                            self.profile = p;
                            return Ok(());
                        }
                    }
                }
            }
            Calibration::Measure => {}
        }
        let p = self.calibrate()?;
        if self.rank() == 0 {
            if let Err(e) = p.save(&path) {
                tracing::warn!(target: "zcomm::comm", "cannot save profile {}: {e}", path.display());
            }
        }
        self.profile = p;
        Ok(())
    }

    /// Whether a cached profile's link still describes this job's: ranks 0 and 1 exchange the
    /// ping-pong size (the link calibration's schedule, `comm::link_calibrate`) and the slowest
    /// rank's median is compared with the profile's link line. Off by more than [`STALE_LINK_FACTOR`]
    /// either way (another placement or network under the same host name, a machine that was
    /// busy when the profile was measured), the caller measures again, with a warning. Every
    /// rank gets the same answer (the same profile and one reduced time). Collective.
    fn cached_link_fits(&self, p: &Profile, path: &std::path::Path) -> Result<bool> {
        let t = &*self.transport;
        if t.size() < 2 {
            return Ok(true);
        }
        let bytes = self.config.pingpong_bytes.max(8);
        let (snd, mut rcv) = (vec![1u8; bytes], vec![0u8; bytes]);
        let mut probe = PairLink {
            t,
            rank: t.rank(),
            snd: &snd,
            rcv: &mut rcv,
        };
        let links = link_calibrate::measure(t, &mut probe, &[bytes], &[LinkPattern::Exchange])?;
        let measured = links.exchange.map_or(0.0, |c| c.time(bytes as f64));
        let predicted = p.link.latency + bytes as f64 / p.link.bandwidth;
        let off = measured / predicted;
        let fits = off.is_finite() && (1.0 / STALE_LINK_FACTOR..=STALE_LINK_FACTOR).contains(&off);
        if !fits {
            tracing::warn!(target: "zcomm::comm", path = %path.display(),
                "the cached profile's link predicts {:.3} ms for a {bytes}-byte exchange, measured {:.3} ms: measuring again",
                predicted * 1e3, measured * 1e3);
        }
        Ok(fits)
    }

    /// Measure the link (ping-pong between ranks 0 and 1), the transport's allreduce and the
    /// codec throughput (all ranks at once, slowest rank counts), and agree on the result.
    /// Collective.
    ///
    /// The link and the allreduce are the mean of a few calls right after one warm-up, not the
    /// median of the link calibration's longer schedule that the staged and NCCL links use: the
    /// host operations' large messages run on buffers that are not warm, and the steady-state
    /// median of many repetitions predicts them too fast.
    pub fn calibrate(&mut self) -> Result<Profile> {
        let t = &*self.transport;
        let (r, p) = (t.rank(), t.size());
        let mut link = Link {
            bandwidth: 10e9,
            latency: 2e-6,
        };
        if p > 1 {
            t.barrier()?;
            let mut vals = [0.0f64; 2];
            if r < 2 {
                let peer = 1 - r;
                let small = [0u8; 8];
                let big = vec![1u8; self.config.pingpong_bytes];
                let mut back = vec![0u8; big.len()];
                let lat_rt = pingpong(t, r, peer, &small, 50)?;
                let lat = lat_rt / 2.0;
                // bandwidth: simultaneous exchanges (what sendrecv and ring steps do) into
                // preallocated buffers, one warm-up
                let reps = ((256usize << 20) / big.len()).clamp(2, 8);
                t.sendrecv_sized(peer, &big, peer, &mut back, TAG_PING)?;
                let t0 = t.wtime();
                for _ in 0..reps {
                    t.sendrecv_sized(peer, &big, peer, &mut back, TAG_PING)?;
                }
                let each = ((t.wtime() - t0) / reps as f64 - lat).max(1e-9);
                vals = [lat, big.len() as f64 / each];
            }
            t.allreduce_f64(&mut vals, ReduceOp::Max)?;
            link = Link {
                latency: vals[0],
                bandwidth: vals[1],
            };
        }
        let codec = self.config.policy.codec().unwrap_or_default();
        // every codec, so that `Auto` can choose among them per message; one that fails on
        // any rank is left out on every rank (with the reason where it failed), not the
        // calibration
        let mut codecs = Vec::new();
        for (&c, dt) in CodecKind::WITH_GPU
            .iter()
            .flat_map(|c| [(c, Dtype::F32), (c, Dtype::F64)])
        {
            t.barrier()?;
            let m = measure_compressor(&*self.compressor, c, dt, 1 << 21);
            let (cs, cd) = m
                .as_ref()
                .map_or((0.0, 0.0), |s| (s.compress, s.decompress));
            let mut v = [-cs, -cd, f64::from(u8::from(m.is_err()))];
            t.allreduce_f64(&mut v, ReduceOp::Max)?; // min of throughputs, any failure
            match m {
                Ok(s) if v[2] < 0.5 => codecs.push(model::CodecSpeed {
                    compress: -v[0],
                    decompress: -v[1],
                    ..s
                }),
                Ok(_) => {
                    tracing::warn!(target: "zcomm::comm", "{c} {dt} not calibrated: it failed on another rank")
                }
                Err(e) => tracing::warn!(target: "zcomm::comm", "{c} {dt} not calibrated: {e}"),
            }
        }
        // the native allreduce (the raw path of allreduce): small and large buffer
        let mut allreduce = None;
        if p > 1 {
            let big = vec![1.0f32; (self.config.pingpong_bytes / 4).max(1)];
            let mut o = vec![0.0f32; big.len()];
            let small = [1.0f32; 2];
            let mut os = [0.0f32; 2];
            let time = |input: &[f32], out: &mut [f32], reps: usize| -> Result<f64> {
                t.allreduce_sum_f32(input, out)?; // warm-up
                t.barrier()?;
                let t0 = t.wtime();
                for _ in 0..reps {
                    t.allreduce_sum_f32(input, out)?;
                }
                Ok((t.wtime() - t0) / reps as f64)
            };
            let ts = time(&small, &mut os, 20)?;
            let tb = time(&big, &mut o, 4)?;
            let mut v = [ts, tb];
            t.allreduce_f64(&mut v, ReduceOp::Max)?;
            allreduce = Some(model::Curve::linear(
                (big.len() * 4) as f64 / (v[1] - v[0]).max(1e-9),
                v[0],
            ));
        }
        // the raw ring's host addition, every rank at once on buffers of the ping-pong's size
        let host_add = {
            let n = (self.config.pingpong_bytes / 4).max(1 << 16);
            let x = vec![1.0f32; n];
            let mut acc = vec![0.0f32; n];
            super::reduce::add_assign(&mut acc, &x); // warm-up (and first touch of `acc`)
            let mut ts = Vec::with_capacity(5);
            for _ in 0..5 {
                t.barrier()?;
                let t0 = t.wtime();
                super::reduce::add_assign(&mut acc, &x);
                ts.push(t.wtime() - t0);
            }
            let mut v = [model::median(&ts)];
            t.allreduce_f64(&mut v, ReduceOp::Max)?;
            (n * 4) as f64 / v[0].max(1e-9)
        };
        let mut prof = Profile::new(link);
        prof.allreduce = allreduce;
        prof.host_add = host_add;
        prof.host = hostname();
        prof.ranks = p;
        prof.compressor = self.compressor.name();
        prof.codecs = codecs;
        // everybody uses rank 0's exact numbers
        let mut bytes = if r == 0 {
            prof.to_json().into_bytes()
        } else {
            Vec::new()
        };
        t.bcast(0, &mut bytes)?;
        let prof = Profile::from_json(&String::from_utf8_lossy(&bytes))?;
        if let Some(cs) = prof.codec_speed(codec, Dtype::F32) {
            tracing::info!(target: "zcomm::comm", "calibrated: link {} latency {:.1} us; {codec} f32 compress {} decompress {}",
                model::fmt_rate(prof.link.bandwidth), prof.link.latency * 1e6,
                model::fmt_rate(cs.compress), model::fmt_rate(cs.decompress));
        }
        Ok(prof)
    }

    pub(super) fn speeds<S: Real>(&self, codec: CodecKind) -> (f64, f64) {
        self.profile
            .codec_speed(codec, S::DTYPE)
            .map(|c| (c.compress, c.decompress))
            .unwrap_or((1e9, 2e9))
    }

    /// The codecs `Auto(preferred)` chooses among for messages of `S`: `preferred` first (it
    /// wins ties), then every other codec the profile has speeds for (the calibrated ones of
    /// [`CodecKind::WITH_GPU`]; a codec outside it is a candidate only as `preferred`), leaving
    /// out codecs that refuse the configured bound (gpz under rel).
    pub(super) fn candidates<S: Real>(&self, preferred: CodecKind) -> Vec<CodecKind> {
        let mut v = vec![preferred];
        v.extend(
            self.profile
                .codecs
                .iter()
                .filter(|c| c.dtype == S::DTYPE.tag() && c.codec != preferred)
                .map(|c| c.codec),
        );
        v.dedup();
        v.retain(|c| c.supports_bound(self.config.bound));
        v
    }
}

fn pingpong(t: &dyn Transport, r: usize, peer: usize, msg: &[u8], reps: usize) -> Result<f64> {
    // one warm-up, then the mean round trip
    let mut t0 = 0.0;
    for i in 0..=reps {
        if i == 1 {
            t0 = t.wtime();
        }
        if r == 0 {
            t.send(peer, TAG_PING, msg)?;
            t.recv(peer, TAG_PING)?;
        } else {
            t.recv(peer, TAG_PING)?;
            t.send(peer, TAG_PING, msg)?;
        }
    }
    Ok((t.wtime() - t0) / reps as f64)
}

fn measure_compressor(
    c: &dyn Compressor,
    codec: CodecKind,
    dt: Dtype,
    n: usize,
) -> Result<model::CodecSpeed> {
    pub(super) fn run<S: Real>(
        c: &dyn Compressor,
        codec: CodecKind,
        n: usize,
    ) -> Result<model::CodecSpeed> {
        let data: Vec<S> = (0..n)
            .map(|i| {
                let x = i as f64 * 1e-4;
                S::from_f64((x.sin() * 3.0 + (x * 7.3).cos()) * 100.0 + (i % 17) as f64 * 1e-3)
            })
            .collect();
        let b = ErrorBound::Noa(1e-3);
        let mut out = vec![S::default(); n];
        let (mut bc, mut bd, mut len) = (f64::INFINITY, f64::INFINITY, 1);
        for _ in 0..3 {
            let t = std::time::Instant::now();
            let s = S::compress_with(c, &data, b, codec)?;
            bc = bc.min(t.elapsed().as_secs_f64());
            let t = std::time::Instant::now();
            S::decompress_with(c, &s, &mut out)?;
            bd = bd.min(t.elapsed().as_secs_f64());
            len = s.len();
        }
        let bytes = (n * S::SIZE) as f64;
        Ok(model::CodecSpeed::new(
            codec,
            S::DTYPE.tag(),
            bytes / bc.max(1e-9),
            bytes / bd.max(1e-9),
            bytes / len as f64,
        ))
    }
    match dt {
        Dtype::F32 => run::<f32>(c, codec, n),
        Dtype::F64 => run::<f64>(c, codec, n),
    }
}

pub(super) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "host".into())
}

/// How far (a factor, either way) a cached profile's link prediction may be from a fresh
/// measurement before the profile is measured again.
const STALE_LINK_FACTOR: f64 = 2.0;
