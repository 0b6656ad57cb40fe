//! A plain component (no Airlock world) with effects: `read-text` reads a
//! file through WASI, `fetch-status` sends a GET through `wasi:http`. It
//! reaches only what the operator's policy grants; anything else is an
//! `err` naming what was refused.

wit_bindgen::generate!({ path: "wit", world: "reach" });

struct Reach;

impl Guest for Reach {
    fn read_text(path: String) -> Result<String, String> {
        std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))
    }

    fn fetch_status(url: String) -> Result<u16, String> {
        wasi_get::get(&url).map(|(status, _)| status)
    }
}

export!(Reach);
