//! A plain component (no Airlock world) with effects: `read-text`,
//! `write-text`, `list-dir` and `file-size` use files through WASI,
//! `fetch-status` sends a GET through `wasi:http`. It reaches only what
//! the operator's policy grants; anything else is an `err` naming what was
//! refused.

wit_bindgen::generate!({ path: "wit", world: "reach" });

struct Reach;

impl Guest for Reach {
    fn read_text(path: String) -> Result<String, String> {
        std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))
    }

    fn write_text(path: String, text: String) -> Result<(), String> {
        std::fs::write(&path, text).map_err(|e| format!("{path}: {e}"))
    }

    fn list_dir(path: String) -> Result<Vec<String>, String> {
        let failed = |e: std::io::Error| format!("{path}: {e}");
        std::fs::read_dir(&path)
            .map_err(failed)?
            .map(|entry| {
                let entry = entry.map_err(failed)?;
                Ok(entry.file_name().to_string_lossy().into_owned())
            })
            .collect()
    }

    fn file_size(path: String) -> Result<u64, String> {
        std::fs::metadata(&path)
            .map(|m| m.len())
            .map_err(|e| format!("{path}: {e}"))
    }

    fn fetch_status(url: String) -> Result<u16, String> {
        wasi_get::get(&url).map(|(status, _)| status)
    }
}

export!(Reach);
