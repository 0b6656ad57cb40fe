//! What every section shares: where the components are, the bench's settings,
//! medians and paired ratios (the two sides alternating in small batches),
//! pinning a pair to one core, and memory sampling.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::{CompileCache, Host};
use serde_json::{Value, json};

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub(crate) fn component(file: &str) -> PathBuf {
    let path = root().join("target/guests").join(file);
    assert!(
        path.is_file(),
        "{} is missing: run `make guests`",
        path.display()
    );
    path
}

pub(crate) struct Lang {
    pub(crate) name: &'static str,
    pub(crate) file: &'static str,
}

pub(crate) const LANGS: [Lang; 4] = [
    Lang {
        name: "Rust",
        file: "wasm32-wasip2/release/stateful.wasm",
    },
    Lang {
        name: "Python",
        file: "python-stateful.wasm",
    },
    Lang {
        name: "JavaScript",
        file: "js-stateful.wasm",
    },
    Lang {
        name: "C",
        file: "c-stateful.wasm",
    },
];

pub(crate) struct Bench {
    pub(crate) quick: bool,
    pub(crate) cache: PathBuf,
    /// How many times the sections with paired ratios run; only the last
    /// pass reports (and runs the other sections).
    pub(crate) passes: usize,
    pub(crate) pass: std::sync::atomic::AtomicUsize,
    /// Every pair measured so far, by ratio.
    pub(crate) samples: std::sync::Mutex<BTreeMap<String, Paired>>,
    /// The paired ratios of this run, for the next run to compare with.
    pub(crate) ratios: std::sync::Mutex<Vec<Value>>,
}

impl Bench {
    /// Whether this is the pass that writes the report.
    pub(crate) fn reporting(&self) -> bool {
        self.pass.load(std::sync::atomic::Ordering::Relaxed) + 1 >= self.passes
    }

    /// The ratio `name`: this pass's share of its `pairs` pairs ([`paired`]),
    /// added to those of the passes before. Returns every pair so far, so
    /// the reporting pass sees pairs from every pass: each ratio is sampled
    /// at several times in the run, not in one stretch that one state of a
    /// noisy machine could cover. The reporting pass keeps the ratio for
    /// the next run's comparison.
    pub(crate) async fn paired<A, B>(&self, name: &str, pairs: usize, a: A, b: B) -> Paired
    where
        A: AsyncFnMut() -> Duration,
        B: AsyncFnMut() -> Duration,
    {
        let measured = paired(pairs.div_ceil(self.passes), a, b).await;
        self.keep(name, measured)
    }

    /// As [`Bench::paired`], for sides of one op each whose difference is
    /// smaller than the machine's noise over a batch: a pair is `ops` of
    /// each, one of a then one of b (or b then a, alternately), so a slow
    /// stretch of the machine falls on both sides alike; each side's time
    /// is the median of its own ops' (a stall of the machine or of a
    /// store, a journal's checkpoint, that lands on one op does not count
    /// against its side).
    pub(crate) async fn interleaved<A, B>(
        &self,
        name: &str,
        pairs: usize,
        ops: usize,
        mut a: A,
        mut b: B,
    ) -> Paired
    where
        A: AsyncFnMut(),
        B: AsyncFnMut(),
    {
        async fn timed(f: &mut impl AsyncFnMut()) -> Duration {
            let started = Instant::now();
            f().await;
            started.elapsed()
        }
        a().await;
        b().await;
        let mut measured = Paired::default();
        for pair in 0..pairs.div_ceil(self.passes) {
            let (mut ta, mut tb) = (Vec::with_capacity(ops), Vec::with_capacity(ops));
            for op in 0..ops.max(1) {
                if (pair + op) % 2 == 0 {
                    ta.push(timed(&mut a).await.as_secs_f64());
                    tb.push(timed(&mut b).await.as_secs_f64());
                } else {
                    tb.push(timed(&mut b).await.as_secs_f64());
                    ta.push(timed(&mut a).await.as_secs_f64());
                }
            }
            let (ta, tb) = (quantile(&ta, 0.5), quantile(&tb, 0.5));
            measured.push(Duration::from_secs_f64(ta), Duration::from_secs_f64(tb));
        }
        self.keep(name, measured)
    }

    /// `measured` kept under `name` with the pairs of the earlier passes;
    /// all of them so far (the reporting pass keeps the ratio for the next
    /// run's comparison).
    pub(crate) fn keep(&self, name: &str, measured: Paired) -> Paired {
        let all = {
            let mut samples = self.samples.lock().unwrap();
            let all = samples.entry(name.to_owned()).or_default();
            all.a.extend(measured.a);
            all.b.extend(measured.b);
            all.ratios.extend(measured.ratios);
            all.clone()
        };
        if self.reporting() {
            self.ratios.lock().unwrap().push(all.record(name));
        }
        all
    }

    /// `values` kept under `name` with those of the earlier passes; all of
    /// them so far.
    pub(crate) fn collect(&self, name: &str, values: Vec<f64>) -> Vec<f64> {
        let mut samples = self.samples.lock().unwrap();
        let all = samples.entry(name.to_owned()).or_default();
        all.a.extend(values);
        all.a.clone()
    }

    pub(crate) fn iters(&self, n: usize) -> usize {
        if self.quick { (n / 20).max(3) } else { n }
    }

    /// A host with `files` loaded under the default limits (one instance
    /// of each prepared ahead of demand).
    pub(crate) async fn host(&self, files: &[PathBuf]) -> Host {
        self.host_preparing(files, airlock::Limits::default().prepared_instances)
            .await
    }

    /// A host with `files` loaded, each preparing `prepared` instances
    /// ahead of demand (0: every call instantiates).
    pub(crate) async fn host_preparing(&self, files: &[PathBuf], prepared: usize) -> Host {
        self.loading(files, prepared).await
    }

    /// What makes [`Bench::host_preparing`]'s host, owning all it needs:
    /// to be run on another runtime, whose cores the threads the host
    /// starts (the one its stores are dropped on among them) then share.
    pub(crate) fn loading(
        &self,
        files: &[PathBuf],
        prepared: usize,
    ) -> impl Future<Output = Host> + Send + 'static {
        let (cache, files) = (self.cache.clone(), files.to_vec());
        async move {
            let mut host = Host::builder()
                .cache(CompileCache::in_dir(&cache))
                .max_concurrent_calls(128)
                .limits(airlock::Limits {
                    prepared_instances: prepared,
                    ..airlock::Limits::default()
                })
                .build()
                .unwrap();
            for f in &files {
                host.load(f).await.unwrap();
            }
            host
        }
    }
}

/// Runs `f` `n` times (after `n / 10` warm-up runs) and returns the median.
pub(crate) async fn median<F: AsyncFnMut()>(n: usize, mut f: F) -> Duration {
    for _ in 0..(n / 10).max(1) {
        f().await;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f().await;
        samples.push(t.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}

pub(crate) fn us(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else if us >= 100.0 {
        format!("{us:.0} µs")
    } else {
        format!("{us:.1} µs")
    }
}

/// A ratio measured robustly on a noisy machine: its two sides run in
/// alternating small batches on this thread (A then B, then B then A, ...),
/// and each pair of batches gives one ratio of per-op times. The report
/// gives the median of those ratios with its interquartile range, next to
/// each side's median.
#[derive(Clone, Default)]
pub(crate) struct Paired {
    pub(crate) a: Vec<f64>,
    pub(crate) b: Vec<f64>,
    pub(crate) ratios: Vec<f64>,
}

/// Runs `pairs` pairs of batches; each side runs one batch and returns its
/// per-op time.
pub(crate) async fn paired<A, B>(pairs: usize, mut a: A, mut b: B) -> Paired
where
    A: AsyncFnMut() -> Duration,
    B: AsyncFnMut() -> Duration,
{
    a().await;
    b().await;
    let mut result = Paired {
        a: Vec::with_capacity(pairs),
        b: Vec::with_capacity(pairs),
        ratios: Vec::with_capacity(pairs),
    };
    for i in 0..pairs {
        result.push_pair(i % 2 == 0, a(), b()).await;
    }
    result
}

/// The `q` quantile of `values` (nearest rank).
pub(crate) fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(rank).copied().unwrap_or(f64::NAN)
}

impl Paired {
    /// One pair: side a took `a`, side b `b`.
    pub(crate) fn push(&mut self, a: Duration, b: Duration) {
        self.a.push(a.as_secs_f64());
        self.b.push(b.as_secs_f64());
        self.ratios.push(ratio(a, b));
    }

    /// One pair of `a` and `b`, run one after the other, `a` first when
    /// `a_first`: each side's future does its work when awaited.
    pub(crate) async fn push_pair(
        &mut self,
        a_first: bool,
        a: impl Future<Output = Duration>,
        b: impl Future<Output = Duration>,
    ) {
        let (ta, tb) = if a_first {
            let ta = a.await;
            (ta, b.await)
        } else {
            let tb = b.await;
            (a.await, tb)
        };
        self.push(ta, tb);
    }

    pub(crate) fn a(&self) -> Duration {
        Duration::from_secs_f64(quantile(&self.a, 0.5))
    }

    pub(crate) fn b(&self) -> Duration {
        Duration::from_secs_f64(quantile(&self.b, 0.5))
    }

    pub(crate) fn ratio(&self) -> f64 {
        quantile(&self.ratios, 0.5)
    }

    pub(crate) fn spread(&self) -> (f64, f64) {
        (quantile(&self.ratios, 0.25), quantile(&self.ratios, 0.75))
    }

    /// `1.02× (IQR 0.98–1.05, 31 pairs)`.
    pub(crate) fn cell(&self) -> String {
        let (q1, q3) = self.spread();
        format!(
            "{:.2}× (IQR {q1:.2}–{q3:.2}, {} pairs)",
            self.ratio(),
            self.ratios.len()
        )
    }

    /// Against "at most `target`": met when the whole spread is at or
    /// under it, not met when the whole spread is over it, else not
    /// settled.
    pub(crate) fn at_most(&self, target: f64) -> &'static str {
        let (q1, q3) = self.spread();
        if q3 <= target {
            "met"
        } else if q1 > target {
            "**not met**"
        } else {
            "not settled"
        }
    }

    /// Against "at least `target`", as [`Paired::at_most`].
    pub(crate) fn at_least(&self, target: f64) -> &'static str {
        let (q1, q3) = self.spread();
        if q1 >= target {
            "met"
        } else if q3 < target {
            "**not met**"
        } else {
            "not settled"
        }
    }

    /// A table row: `name`, each side's median per op, the ratio.
    pub(crate) fn row(&self, name: &str) -> String {
        format!(
            "| {name} | {} | {} | {} |",
            us(self.a()),
            us(self.b()),
            self.cell()
        )
    }

    /// Side a less side b, pair by pair: the median and interquartile
    /// range of the differences.
    pub(crate) fn difference(&self) -> (Duration, Duration, Duration) {
        let differences: Vec<f64> = self.a.iter().zip(&self.b).map(|(a, b)| a - b).collect();
        let at = |q| Duration::from_secs_f64(quantile(&differences, q).max(0.0));
        (at(0.5), at(0.25), at(0.75))
    }

    /// The ratio as a record for the next run's comparison.
    pub(crate) fn record(&self, name: &str) -> Value {
        let (q1, q3) = self.spread();
        json!({"name": name, "ratio": self.ratio(), "q1": q1, "q3": q3})
    }
}

/// Keeps the calling thread (and the threads it starts from now on) and
/// the processes given on some cores until dropped; the thread's own
/// affinity is given back on drop.
pub(crate) struct Pinned {
    pub(crate) previous: libc::cpu_set_t,
}

impl Pinned {
    /// On the core the thread runs on now: both sides of a pair then run
    /// on the same core, whatever the other core's neighbours do.
    #[allow(unsafe_code)]
    pub(crate) fn here(processes: &[u32]) -> Self {
        // SAFETY: reads the calling thread's core.
        let cpu = unsafe { libc::sched_getcpu() };
        let cpus: Vec<usize> = usize::try_from(cpu).into_iter().collect();
        Self::on(&cpus, processes)
    }

    /// On the first `cores` cores.
    pub(crate) fn to_first(cores: usize) -> Self {
        Self::on(&(0..cores).collect::<Vec<_>>(), &[])
    }

    /// On `cpus` (none: left as it is).
    #[allow(unsafe_code)]
    fn on(cpus: &[usize], processes: &[u32]) -> Self {
        // SAFETY: cpu_set_t is plain data; the calls get valid pointers to
        // sets of the size given, and pid 0 is the calling thread.
        unsafe {
            let mut previous: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            libc::sched_getaffinity(0, size, &mut previous);
            if !cpus.is_empty() {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                for &cpu in cpus {
                    libc::CPU_SET(cpu, &mut set);
                }
                libc::sched_setaffinity(0, size, &set);
                for &pid in processes {
                    libc::sched_setaffinity(pid as libc::pid_t, size, &set);
                }
            }
            Self { previous }
        }
    }
}

impl Drop for Pinned {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: as in `Pinned::on`.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.previous);
        }
    }
}

/// Times `n` runs of `f`; the per-op time.
pub(crate) async fn batch<F: AsyncFnMut()>(n: usize, mut f: F) -> Duration {
    let started = Instant::now();
    for _ in 0..n {
        f().await;
    }
    started.elapsed() / n.max(1) as u32
}

pub(crate) fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

pub(crate) fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**not met**" }
}

pub(crate) fn rss_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Samples the process's resident memory every 5 ms until `done`, and
/// returns the largest sample (KiB).
pub(crate) fn sample_peak_rss(
    done: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            peak = peak.max(rss_kib("VmRSS:"));
            std::thread::sleep(Duration::from_millis(5));
        }
        peak
    })
}

/// `airlock mcp` over `transport` (`stdio`, or `http` on a free loopback
/// port: start it with [`serve_http`]) serving `tool`, its sessions in
/// `store` (a file or a URL), compiling into the bench's cache.
pub(crate) fn airlock_mcp(
    b: &Bench,
    transport: &str,
    tool: &Path,
    store: impl AsRef<std::ffi::OsStr>,
) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_airlock"));
    command
        .args([
            "mcp",
            "--transport",
            transport,
            "--listen",
            "127.0.0.1:0",
            "--tool",
        ])
        .arg(tool)
        .arg("--store")
        .arg(store)
        .env("AIRLOCK_CACHE_DIR", &b.cache)
        .env_remove("RUST_LOG");
    command
}

/// Starts `airlock mcp --transport http` from `command`; the child and the
/// URL it says it serves at.
pub(crate) fn serve_http(mut command: Command) -> (std::process::Child, String) {
    let mut child = command
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stderr.take().unwrap()));
    let line = lines.next().unwrap().unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_owned();
    std::thread::spawn(move || lines.for_each(drop));
    (child, url)
}
