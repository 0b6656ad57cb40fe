//! Measuring JSON values without building their text.

use serde::Serialize;
use serde_json::Value;

/// Bytes of `value` as compact JSON, counted as it is written, without
/// building the text. `usize::MAX` if it cannot be serialized.
pub(crate) fn len(value: &impl Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// Whether `value`'s arrays and objects nest deeper than `max` (as
/// [`depth`] counts). Recursion stops one level past `max`, so the stack
/// it uses is bounded by `max`, and nothing is allocated: the check every
/// applied value gets, with [`depth`] left for saying how deep.
pub(crate) fn deeper_than(value: &Value, max: usize) -> bool {
    // A container is 1 deep plus its deepest child.
    match value {
        Value::Array(items) => max == 0 || items.iter().any(|c| deeper_than(c, max - 1)),
        Value::Object(map) => max == 0 || map.values().any(|c| deeper_than(c, max - 1)),
        _ => false,
    }
}

/// How deeply `value`'s arrays and objects nest (a scalar: 0, `[]`: 1).
/// Iterative, so any depth is measured without recursion.
pub(crate) fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((value, level)) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items.iter().map(|c| (c, level + 1))),
            Value::Object(map) => stack.extend(map.values().map(|c| (c, level + 1))),
            _ => continue,
        }
        deepest = deepest.max(level + 1);
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn measures_like_the_text() {
        for value in [json!(1), json!({"a": [1, "x\"y"], "b": null}), json!("é\n")] {
            assert_eq!(len(&value), value.to_string().len());
        }
        assert_eq!(depth(&json!(1)), 0);
        assert_eq!(depth(&json!([])), 1);
        assert_eq!(depth(&json!({"a": [1, {"b": [2]}]})), 4);
        for value in [
            json!(1),
            json!([]),
            json!({"a": [1, {"b": [2]}]}),
            json!([[[]], 2]),
        ] {
            for max in 0..6 {
                assert_eq!(
                    deeper_than(&value, max),
                    depth(&value) > max,
                    "{value} {max}"
                );
            }
        }
    }
}
