//! Decoding a stored entry in one pass.
//!
//! [`Entry`], [`Item`] and [`ContextOp`] are internally tagged, and an
//! item's fields are flattened into its event: serde's derived decoding
//! of them reads each object into a buffered tree first (serde's
//! `Content`) and decodes that, so a call's output was parsed into three
//! trees before it was an [`Entry`], and that cost as much as parsing it
//! into a `serde_json::Value` (replay and resume read every record).
//! Airlock writes every tag first (`entry`, then the event's `id`, `run_id`
//! and `type`, then each op's `op`), so [`entry_from_json`] reads the tags
//! in that order and hands the rest of each object to a plain struct's
//! derived decoding: no tree. It does so for the records a tool call
//! writes, deps and usage; anything else (a model's turn, a run's start
//! and end, a format-1 record, keys in another order or unknown, a key
//! twice, a damaged record) is decoded the derived way, whose error is the
//! one reported.
//!
//! Invariant: both ways give the same [`Entry`] for any text (a test holds
//! them to it on a record of every kind, every field set), so what a
//! store holds reads the same whichever way it was decoded. Cost: one
//! pass over the text, no tree; a record the one-pass decoding leaves is
//! parsed twice, the first parse stopping where it meets what it does not
//! expect (for a model's turn, at its `type`).

use std::fmt;

use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, Visitor};
use serde_json::{Map, Value};

use super::conversation::Captured;
use super::record::{CallStatus, CalledBy, Entry, Event, Item};
use crate::context::{ContextOp, Usage};
use crate::kind::ErrorKind;
use crate::spec::ToolCall;

/// The entry `text` holds (a stored record's `entry` column): decoded in
/// one pass when Airlock wrote it, else the derived way.
pub fn entry_from_json(text: &str) -> serde_json::Result<Entry> {
    one_pass(text).or_else(|_| serde_json::from_str(text))
}

/// The one-pass decoding alone: an error for anything it leaves.
fn one_pass(text: &str) -> serde_json::Result<Entry> {
    let mut json = serde_json::Deserializer::from_str(text);
    let entry = Entry::one_pass(&mut json)?;
    json.end()?;
    Ok(entry)
}

/// An object decoded in one pass from its tags: [`OneMap::from_map`]
/// reads them, in the order Airlock writes them, and the rest.
trait OneMap: Sized {
    /// What it is, for an error message.
    const WHAT: &'static str;

    fn from_map<'de, A: MapAccess<'de>>(map: A) -> Result<Self, A::Error>;

    /// `Self` from the object `deserializer` holds.
    fn one_pass<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(OneMapVisitor(std::marker::PhantomData))
    }
}

struct OneMapVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: OneMap> Visitor<'de> for OneMapVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::WHAT)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::from_map(map)
    }
}

/// Not decoded in one pass: the derived way decodes it.
fn left<E: de::Error>() -> E {
    E::custom("left to the derived decoding")
}

/// The next key, which must be `name`, and its value.
fn field<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    map: &mut A,
    name: &str,
) -> Result<T, A::Error> {
    match map.next_key::<&'de str>()? {
        Some(key) if key == name => map.next_value(),
        _ => Err(left()),
    }
}

/// The rest of an object, after the keys read, decoded as a `T`.
fn rest<'de, A: MapAccess<'de>, T: Deserialize<'de>>(map: A) -> Result<T, A::Error> {
    T::deserialize(MapAccessDeserializer::new(map))
}

/// An [`Entry`]: `entry` first.
impl OneMap for Entry {
    const WHAT: &'static str = "a journal entry";

    fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Entry, A::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Deps {
            deps: Map<String, Value>,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Usages {
            usage: Usage,
            iteration: u32,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Events {
            #[serde(deserialize_with = "Event::one_pass")]
            event: Event,
            #[serde(default)]
            keyed: bool,
        }
        Ok(match field::<_, &str>(&mut map, "entry")? {
            "event" => {
                let Events { event, keyed } = rest(map)?;
                Entry::Event { event, keyed }
            }
            "deps" => Entry::Deps {
                deps: rest::<_, Deps>(map)?.deps,
            },
            "usage" => {
                let Usages { usage, iteration } = rest(map)?;
                Entry::Usage { usage, iteration }
            }
            _ => return Err(left()),
        })
    }
}

/// A format-2 event (no time of its own): `id`, `run_id`, `type` first.
impl OneMap for Event {
    const WHAT: &'static str = "a journal item";

    fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Event, A::Error> {
        // The fields of the items a tool call writes, as `Item` names
        // them (a test holds the two to the same decoding).
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Call {
            call_id: String,
            name: String,
            arguments: String,
            iteration: u32,
            #[serde(default)]
            by: Option<CalledBy>,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Update {
            call_id: String,
            #[serde(deserialize_with = "ops")]
            ops: Vec<ContextOp>,
        }
        let id = field(&mut map, "id")?;
        let run_id = field(&mut map, "run_id")?;
        let item = match field::<_, &str>(&mut map, "type")? {
            "function_call" => {
                let Call {
                    call_id,
                    name,
                    arguments,
                    iteration,
                    by,
                } = rest(map)?;
                Item::FunctionCall {
                    call: ToolCall {
                        id: call_id,
                        name,
                        arguments,
                        retry: 0,
                    },
                    iteration,
                    by,
                }
            }
            "function_call_output" => map_output(map)?,
            "context_update" => {
                let Update { call_id, ops } = rest(map)?;
                Item::ContextUpdate { call_id, ops }
            }
            _ => return Err(left()),
        };
        Ok(Event {
            id,
            run_id,
            at_ms: 0,
            item,
        })
    }
}

/// A `function_call_output` item's fields after its tag: its own, then
/// (from the first key that is none of them) what the guest wrote, its
/// [`Captured`]. A key read twice is left to the derived decoding, which
/// refuses it.
fn map_output<'de, A: MapAccess<'de>>(mut map: A) -> Result<Item, A::Error> {
    fn once<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
        map: &mut A,
        slot: &mut Option<T>,
    ) -> Result<(), A::Error> {
        match slot {
            Some(_) => Err(left()),
            None => {
                *slot = Some(map.next_value()?);
                Ok(())
            }
        }
    }
    let (mut call_id, mut name, mut output) = (None, None, None);
    let mut status: Option<CallStatus> = None;
    let mut error_kind: Option<Option<ErrorKind>> = None;
    let mut duration_us = None;
    let mut arguments: Option<Option<String>> = None;
    let mut guest = Captured::default();
    while let Some(key) = map.next_key::<&'de str>()? {
        match key {
            "call_id" => once(&mut map, &mut call_id)?,
            "name" => once(&mut map, &mut name)?,
            "status" => once(&mut map, &mut status)?,
            "output" => once(&mut map, &mut output)?,
            "error_kind" => once(&mut map, &mut error_kind)?,
            "duration_us" => once(&mut map, &mut duration_us)?,
            "arguments" => once(&mut map, &mut arguments)?,
            _ => {
                guest = rest(Prepended {
                    first: Some(key),
                    map,
                })?;
                break;
            }
        }
    }
    match (call_id, name, status, output, duration_us) {
        (Some(call_id), Some(name), Some(status), Some(output), Some(duration_us)) => {
            Ok(Item::FunctionCallOutput {
                call_id,
                name,
                status,
                output,
                error_kind: error_kind.flatten(),
                duration_us,
                arguments: arguments.flatten(),
                guest,
            })
        }
        _ => Err(left()),
    }
}

/// The rest of a `function_call_output` item, for its [`Captured`]: a map
/// whose next key, already read, is `first`. A key the item or its event
/// has already read is left to the derived decoding (which refuses it as
/// a duplicate); any other goes to the guest's fields.
struct Prepended<'de, A> {
    first: Option<&'de str>,
    map: A,
}

/// The keys read before a `function_call_output` item's [`Captured`].
const READ: [&str; 10] = [
    "id",
    "run_id",
    "type",
    "call_id",
    "name",
    "status",
    "output",
    "error_kind",
    "duration_us",
    "arguments",
];

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Prepended<'de, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let key = match self.first.take() {
            Some(first) => first,
            None => match self.map.next_key::<&'de str>()? {
                Some(key) => key,
                None => return Ok(None),
            },
        };
        if READ.contains(&key) {
            return Err(left());
        }
        seed.deserialize(key.into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// A call's ops, each [`ContextOp`] decoded in one pass.
fn ops<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<ContextOp>, D::Error> {
    struct Op(ContextOp);
    impl<'de> Deserialize<'de> for Op {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            ContextOp::one_pass(deserializer).map(Op)
        }
    }
    let ops = Vec::<Op>::deserialize(deserializer)?;
    Ok(ops.into_iter().map(|op| op.0).collect())
}

impl OneMap for ContextOp {
    const WHAT: &'static str = "a context op";

    fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<ContextOp, A::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Valued {
            key: String,
            value: Value,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Keyed {
            key: String,
        }
        let valued = |map: A| rest::<_, Valued>(map);
        Ok(match field::<_, &str>(&mut map, "op")? {
            "set" => {
                let Valued { key, value } = valued(map)?;
                ContextOp::Set { key, value }
            }
            "merge" => {
                let Valued { key, value } = valued(map)?;
                ContextOp::Merge { key, value }
            }
            "append" => {
                let Valued { key, value } = valued(map)?;
                ContextOp::Append { key, value }
            }
            "delete" => ContextOp::Delete {
                key: rest::<_, Keyed>(map)?.key,
            },
            _ => return Err(left()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::Record;

    /// Every record of the committed sample (every kind, every field set),
    /// as Airlock writes its entry: decoded the same both ways, and in one
    /// pass for each kind the one-pass decoding takes.
    #[test]
    fn one_pass_and_derived_decoding_agree_on_every_kind_of_record() {
        let sample = include_str!("testdata/records.jsonl");
        let mut one_passed = Vec::new();
        for line in sample.lines() {
            let record: Record = serde_json::from_str(line).unwrap();
            let text = serde_json::to_string(&record.entry).unwrap();
            let derived: Entry = serde_json::from_str(&text).unwrap();
            assert_eq!(entry_from_json(&text).unwrap(), derived, "{text}");
            if let Ok(entry) = one_pass(&text) {
                assert_eq!(entry, derived, "{text}");
                one_passed.push(record.seq);
            }
        }
        // deps, the call's intent, output and ops, and usage.
        assert_eq!(one_passed, [1, 6, 7, 8, 11]);
    }

    #[test]
    fn what_one_pass_leaves_is_decoded_or_refused_the_derived_way() {
        // Keys in another order, a tag of its own among them.
        let reordered = r#"{"event":{"type":"context_update","run_id":"r","id":"item_1","call_id":"c","ops":[{"key":"k","op":"delete"}]},"entry":"event"}"#;
        assert!(one_pass(reordered).is_err());
        let entry = entry_from_json(reordered).unwrap();
        assert_eq!(
            entry.event().map(|e| &e.item),
            Some(&Item::ContextUpdate {
                call_id: "c".into(),
                ops: vec![ContextOp::Delete { key: "k".into() }],
            })
        );
        // A damaged record: the derived decoding's error, naming the field.
        let damaged = r#"{"entry":"usage","usage":{"requests":1}}"#;
        let error = entry_from_json(damaged).unwrap_err().to_string();
        let derived = serde_json::from_str::<Entry>(damaged)
            .unwrap_err()
            .to_string();
        assert_eq!(error, derived);
        assert!(
            error.contains("iteration") || error.contains("tool_calls"),
            "{error}"
        );
        // A key twice, a tag among them, is refused as the derived way
        // refuses it; a key neither knows is ignored by both.
        let output = |extra: &str| {
            format!(
                r#"{{"entry":"event","event":{{"id":"item_2","run_id":"r","type":"function_call_output","call_id":"c","name":"t","status":"completed","output":"1","duration_us":5,"stdout":"x"{extra}}}}}"#
            )
        };
        for twice in [
            r#"{"entry":"deps","deps":{},"entry":"usage"}"#.to_owned(),
            output(r#","call_id":"d""#),
            output(r#","type":"error""#),
            r#"{"entry":"event","event":{"id":"i","run_id":"r","type":"context_update","call_id":"c","ops":[{"op":"delete","key":"k","op":"set"}]}}"#.to_owned(),
        ] {
            assert!(serde_json::from_str::<Entry>(&twice).is_err(), "{twice}");
            assert!(entry_from_json(&twice).is_err(), "{twice}");
        }
        let unknown = output(r#","later":true"#);
        assert!(one_pass(&unknown).is_ok());
        assert_eq!(
            entry_from_json(&unknown).unwrap(),
            serde_json::from_str::<Entry>(&unknown).unwrap()
        );
        // Trailing text is refused, not ignored.
        assert!(entry_from_json(r#"{"entry":"deps","deps":{}} x"#).is_err());
    }
}
