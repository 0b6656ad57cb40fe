//! §2 Cold start: compiling, loading from the cache, the first call.

use std::fmt::Write as _;

use crate::harness::{Bench, LANGS, component, median, ratio, us, verdict};
use airlock::CompileCache;

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(out, "## 2. Cold start\n").unwrap();
    writeln!(
        out,
        "Compiling a component (Cranelift, once per machine) versus loading the compiled code from the \
         on-disk cache. **By file** is what `airlock` does on every start: the file's path, size and \
         modification time find the entry without reading the component, then a memory map. **By content** \
         is the fallback after the file changed: hash the whole component, then map.\n"
    )
    .unwrap();
    writeln!(
        out,
        "| component | size | compile | load from cache, by file | speed-up | by content |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|---|---|").unwrap();
    let host = b.host(&[]).await;
    let engine = host.sandbox().engine().clone();
    let mut checks = Vec::new();
    for lang in &LANGS {
        let bytes = std::fs::read(component(lang.file)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cache = CompileCache::in_dir(dir.path());
        let compile_runs = if lang.name == "Python" || lang.name == "JavaScript" {
            1
        } else {
            b.iters(20)
        };
        let compile = median(compile_runs, async || {
            let fresh = tempfile::tempdir().unwrap();
            CompileCache::in_dir(fresh.path())
                .load(&engine, &bytes, || {})
                .unwrap();
        })
        .await;
        let path = component(lang.file);
        cache.load(&engine, &bytes, || {}).unwrap();
        let stamp = airlock::sandbox::FileStamp::of(&path).unwrap();
        cache.remember_file(&engine, &path, stamp, &bytes);
        let by_file = median(b.iters(200), async || {
            assert!(cache.lookup_file(&engine, &path).is_some());
        })
        .await;
        let by_content = median(b.iters(100), async || {
            let (_, outcome) = cache.load(&engine, &bytes, || {}).unwrap();
            assert_eq!(outcome, airlock::sandbox::CacheOutcome::Hit);
        })
        .await;
        let speedup = ratio(compile, by_file);
        writeln!(
            out,
            "| {} | {:.1} MB | {} | {} | {:.0}× | {} |",
            lang.name,
            bytes.len() as f64 / 1e6,
            us(compile),
            us(by_file),
            speedup,
            us(by_content)
        )
        .unwrap();
        checks.push((lang.name, speedup));
        eprintln!(
            "cold start {}: compile {} by file {}",
            lang.name,
            us(compile),
            us(by_file)
        );
    }
    writeln!(out, "\nTargets:\n").unwrap();
    for (name, s) in checks
        .iter()
        .filter(|(n, _)| *n == "Python" || *n == "JavaScript")
    {
        writeln!(
            out,
            "- {name}: cached start ≥ 1,000× faster than compile: {s:.0}× — {}",
            verdict(*s >= 1000.0)
        )
        .unwrap();
    }
    writeln!(out).unwrap();
}
