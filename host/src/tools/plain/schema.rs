//! JSON Schemas from WIT types: what a model must send to call a plain
//! component's function.
//!
//! | WIT | JSON (and its schema) |
//! |---|---|
//! | `bool` | `true`/`false` (`boolean`) |
//! | `u8` … `s64` | a whole number (`integer` with the type's exact `minimum` and `maximum`) |
//! | `f32`, `f64` | a number (`number`); a result that is NaN or infinite is the string `"NaN"`, `"Infinity"` or `"-Infinity"` |
//! | `char` | a string of exactly one Unicode scalar value |
//! | `string` | a string |
//! | `list<T>` | an array of `T` (`list<u8>` too: an array of numbers 0 to 255) |
//! | `list<T, N>` | an array of exactly `N` `T` |
//! | `option<T>` | `null`, or the `T` (`{"some": T}` when `T` is itself an option, so the two `none`s differ) |
//! | `result<T, E>` | `{"tag": "ok", "val": T}` or `{"tag": "err", "val": E}` (`val` absent without a payload type); a function's own `result` is its outcome instead: `ok` is the tool's result, `err` a failure |
//! | `tuple<A, B>` | an array `[A, B]` (`prefixItems`, exactly that many) |
//! | `record` | an object with every field (names as in WIT, kebab-case), no others |
//! | `variant` | `{"tag": "case", "val": payload}` (`val` absent for a case without payload) |
//! | `enum` | the case's name |
//! | `flags` | an array of the set flags' names, each once (in any order; results list them in the WIT's order) |
//!
//! Resources (`own`, `borrow`), futures, streams and error contexts cannot
//! cross as JSON: a function whose parameters or result hold one is not
//! offered as a tool (`unsupported` says why). Maps are not enabled in
//! this engine.
//!
//! The schemas use only keywords that OpenAI's and Anthropic's tool formats
//! and MCP accept: the top level is a plain object (`type`, `properties`,
//! `required`, `additionalProperties`), and below it `type`, `properties`,
//! `required`, `additionalProperties`, `items`, `prefixItems`,
//! `minItems`, `maxItems`, `uniqueItems`, `enum`, `anyOf`, `minimum`,
//! `maximum`, `minLength`, `maxLength` and `description` ([`KEYWORDS`]).
//! No `$ref`: a named type used twice is written out twice, within a size
//! budget ([`MAX_SCHEMA_BYTES`](crate::spec::MAX_SCHEMA_BYTES)).

use std::collections::HashMap;

use serde_json::{Map, Value, json};
use wasmtime::component::Type;
use wasmtime::component::types::{Case, Field};

use super::docs::{PackageDocs, Scope, TypeDocs};

/// Every keyword a derived schema uses.
pub const KEYWORDS: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "enum",
    "anyOf",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "description",
];

/// Deepest nesting of types a tool's parameters or result may have.
pub const MAX_TYPE_DEPTH: usize = 32;

/// Why a type cannot cross as JSON, if it cannot (at any depth).
pub(crate) fn unsupported(ty: &Type) -> Option<String> {
    fn walk(ty: &Type, depth: usize) -> Option<String> {
        if depth > MAX_TYPE_DEPTH {
            return Some(format!(
                "its types nest deeper than {MAX_TYPE_DEPTH} levels"
            ));
        }
        let inner = |t: &Type| walk(t, depth + 1);
        match ty {
            Type::Own(_) | Type::Borrow(_) => {
                Some("it passes a resource handle (own/borrow), which JSON cannot carry".into())
            }
            Type::Future(_) => Some("it passes a future, which JSON cannot carry".into()),
            Type::Stream(_) => Some("it passes a stream, which JSON cannot carry".into()),
            Type::ErrorContext => {
                Some("it passes an error-context, which JSON cannot carry".into())
            }
            Type::Map(_) => Some("it uses a map type, which this engine does not enable".into()),
            Type::List(list) => inner(&list.ty()),
            Type::FixedLengthList(list) => inner(&list.ty()),
            Type::Option(option) => inner(&option.ty()),
            Type::Result(result) => result
                .ok()
                .as_ref()
                .and_then(inner)
                .or_else(|| result.err().as_ref().and_then(inner)),
            Type::Record(record) => record.fields().find_map(|f| inner(&f.ty)),
            Type::Tuple(tuple) => tuple.types().find_map(|t| inner(&t)),
            Type::Variant(variant) => variant.cases().find_map(|c| c.ty.as_ref().and_then(inner)),
            Type::Bool
            | Type::S8
            | Type::U8
            | Type::S16
            | Type::U16
            | Type::S32
            | Type::U32
            | Type::S64
            | Type::U64
            | Type::Float32
            | Type::Float64
            | Type::Char
            | Type::String
            | Type::Enum(_)
            | Type::Flags(_) => None,
        }
    }
    walk(ty, 0)
}

/// Whether `ty`'s JSON form can be `null` (so an `option` of it needs the
/// `{"some": …}` form).
pub(crate) fn nullable(ty: &Type) -> bool {
    matches!(ty, Type::Option(_))
}

/// Most types of one key ([`NamedTypes`]) compared with a type to find its
/// name: past it, types of that key get no docs (a hostile component could
/// otherwise make every schema node compare itself with thousands).
const MAX_SAME_KEY: usize = 64;

/// The types a scope exports, by name, indexed by a key that equal types
/// share (their shape, or their kind): finding a type's name is one lookup
/// and at most [`MAX_SAME_KEY`] comparisons, whatever the scope holds.
#[derive(Default)]
pub(crate) struct NamedTypes {
    all: Vec<(Type, String)>,
    by_key: HashMap<String, Vec<usize>>,
}

impl NamedTypes {
    /// `all`, indexed.
    pub(crate) fn new(all: Vec<(Type, String)>) -> Self {
        let mut by_key: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, (ty, _)) in all.iter().enumerate() {
            by_key.entry(type_key(ty)).or_default().push(i);
        }
        Self { all, by_key }
    }

    /// The name of `ty`, if the scope exports it (equal types are the same
    /// type).
    fn name_of(&self, ty: &Type) -> Option<&str> {
        let bucket = self.by_key.get(&type_key(ty))?;
        if bucket.len() > MAX_SAME_KEY {
            return None;
        }
        bucket
            .iter()
            .map(|&i| &self.all[i])
            .find(|(t, _)| t == ty)
            .map(|(_, name)| name.as_str())
    }
}

/// What equal types share: a defined type's shape ([`super::docs::shape`]),
/// else its kind.
fn type_key(ty: &Type) -> String {
    super::docs::shape(ty).unwrap_or_else(|| {
        let kind = match ty {
            Type::List(_) => "list",
            Type::FixedLengthList(_) => "fixed-list",
            Type::Option(_) => "option",
            Type::Result(_) => "result",
            Type::Tuple(_) => "tuple",
            _ => "other",
        };
        kind.to_owned()
    })
}

/// The names and doc comments of the types a function's scope exports, to
/// describe its parameters and their fields.
pub(crate) struct Names<'a> {
    /// Named types of the scope.
    pub(crate) types: &'a NamedTypes,
    pub(crate) docs: Option<&'a PackageDocs>,
    pub(crate) scope: Scope<'a>,
}

impl<'a> Names<'a> {
    /// The docs of `ty`, when it is one of the scope's named types: found
    /// among the types the scope exports, or (for the world's own types,
    /// which wasmtime does not name) by its shape.
    fn docs_of(&self, ty: &Type) -> Option<&'a TypeDocs> {
        let docs = self.docs?;
        let types: &'a NamedTypes = self.types;
        let name = match types.name_of(ty) {
            Some(name) => name,
            None => match self.scope {
                Scope::World => docs.world_type(&super::docs::shape(ty)?)?,
                Scope::Interface(_) => return None,
            },
        };
        docs.ty(self.scope, name)
    }
}

/// A schema over budget: the type is too large to offer as a tool.
#[derive(Debug)]
pub(crate) struct TooLarge;

/// Builds schemas for one function's parameters, within a budget of
/// schema nodes (a named type used many times is written out each time).
pub(crate) struct Builder<'a> {
    names: Names<'a>,
    /// Schema nodes still allowed.
    budget: usize,
}

impl<'a> Builder<'a> {
    /// A builder that writes at most about `max_bytes` of schema.
    pub(crate) fn new(names: Names<'a>, max_bytes: usize) -> Self {
        // A node of a schema is some tens of bytes of JSON at least.
        Self {
            names,
            budget: max_bytes / 16,
        }
    }

    /// The input schema for `params`: an object with one required property
    /// per parameter, nothing else. A parameter of a named type is
    /// described by the type's doc comment, when it has one.
    pub(crate) fn parameters<'p>(
        &mut self,
        params: impl Iterator<Item = (&'p str, &'p Type)>,
    ) -> Result<Value, TooLarge> {
        let mut properties = Map::new();
        let mut required = Vec::new();
        for (name, ty) in params {
            properties.insert(name.to_owned(), self.schema(ty)?);
            required.push(Value::String(name.to_owned()));
        }
        let mut schema = json!({
            "type": "object",
            "properties": properties,
            "additionalProperties": false,
        });
        // An empty `required` is refused by draft-4 validators some clients use.
        if !required.is_empty() {
            schema["required"] = Value::Array(required);
        }
        Ok(schema)
    }

    fn spend(&mut self) -> Result<(), TooLarge> {
        self.budget = self.budget.checked_sub(1).ok_or(TooLarge)?;
        Ok(())
    }

    /// The schema of one value of type `ty` (supported: see
    /// [`unsupported`]).
    pub(crate) fn schema(&mut self, ty: &Type) -> Result<Value, TooLarge> {
        self.spend()?;
        let docs = self.names.docs_of(ty);
        Ok(match ty {
            Type::Bool => json!({"type": "boolean"}),
            Type::S8 => integer(i8::MIN.into(), i8::MAX.into()),
            Type::U8 => integer(0, u8::MAX.into()),
            Type::S16 => integer(i16::MIN.into(), i16::MAX.into()),
            Type::U16 => integer(0, u16::MAX.into()),
            Type::S32 => integer(i32::MIN.into(), i32::MAX.into()),
            Type::U32 => integer(0, u32::MAX.into()),
            Type::S64 => integer(i64::MIN.into(), i64::MAX.into()),
            Type::U64 => integer(0, u64::MAX.into()),
            Type::Float32 | Type::Float64 => json!({"type": "number"}),
            Type::Char => json!({"type": "string", "minLength": 1, "maxLength": 1}),
            Type::String => json!({"type": "string"}),
            Type::List(list) => {
                let element = list.ty();
                let mut schema = json!({"type": "array", "items": self.schema(&element)?});
                if element == Type::U8 {
                    describe(&mut schema, "Bytes, as numbers from 0 to 255.");
                }
                schema
            }
            Type::FixedLengthList(list) => json!({
                "type": "array",
                "items": self.schema(&list.ty())?,
                "minItems": list.len(),
                "maxItems": list.len(),
            }),
            Type::Option(option) => {
                let inner = option.ty();
                let some = self.schema(&inner)?;
                let some = if nullable(&inner) {
                    tagged_object(&[("some", some)])
                } else {
                    some
                };
                json!({"anyOf": [{"type": "null"}, some]})
            }
            Type::Result(result) => {
                let ok = result.ok().map(|t| self.schema(&t)).transpose()?;
                let err = result.err().map(|t| self.schema(&t)).transpose()?;
                json!({"anyOf": [tagged("ok", ok), tagged("err", err)]})
            }
            Type::Tuple(tuple) => {
                let items = tuple
                    .types()
                    .map(|t| self.schema(&t))
                    .collect::<Result<Vec<_>, _>>()?;
                let n = items.len();
                json!({"type": "array", "prefixItems": items, "minItems": n, "maxItems": n})
            }
            Type::Record(record) => {
                let fields: Vec<Field<'_>> = record.fields().collect();
                let mut properties = Vec::with_capacity(fields.len());
                for field in &fields {
                    let mut schema = self.schema(&field.ty)?;
                    if let Some(text) = docs.and_then(|d| d.item(field.name)) {
                        describe(&mut schema, text);
                    }
                    properties.push((field.name, schema));
                }
                tagged_object(&properties)
            }
            Type::Variant(variant) => {
                let cases: Vec<Case<'_>> = variant.cases().collect();
                let mut options = Vec::with_capacity(cases.len());
                for case in &cases {
                    let payload = case.ty.as_ref().map(|t| self.schema(t)).transpose()?;
                    let mut schema = tagged(case.name, payload);
                    if let Some(text) = docs.and_then(|d| d.item(case.name)) {
                        describe(&mut schema, text);
                    }
                    options.push(schema);
                }
                json!({"anyOf": options})
            }
            Type::Enum(cases) => {
                let names: Vec<&str> = cases.names().collect();
                let mut schema = json!({"type": "string", "enum": names});
                if let Some(listed) = item_docs(docs, &names) {
                    describe(&mut schema, &listed);
                }
                schema
            }
            Type::Flags(flags) => {
                let names: Vec<&str> = flags.names().collect();
                let mut schema = json!({
                    "type": "array",
                    "items": {"type": "string", "enum": names},
                    "uniqueItems": true,
                });
                if let Some(listed) = item_docs(docs, &names) {
                    describe(&mut schema, &listed);
                }
                schema
            }
            // Refused by `unsupported` before any schema is built.
            Type::Own(_)
            | Type::Borrow(_)
            | Type::Future(_)
            | Type::Stream(_)
            | Type::ErrorContext
            | Type::Map(_) => json!({}),
        })
        .map(|mut schema| {
            if let Some(text) = docs.and_then(TypeDocs::docs)
                && !matches!(ty, Type::Enum(_) | Type::Flags(_))
            {
                describe(&mut schema, text);
            }
            schema
        })
    }
}

fn integer(minimum: i128, maximum: i128) -> Value {
    let number = |n: i128| {
        i64::try_from(n)
            .map(Value::from)
            .or_else(|_| u64::try_from(n).map(Value::from))
            .unwrap_or(Value::Null)
    };
    json!({"type": "integer", "minimum": number(minimum), "maximum": number(maximum)})
}

/// An object with exactly these properties, all required.
fn tagged_object(properties: &[(&str, Value)]) -> Value {
    let required: Vec<&str> = properties.iter().map(|(name, _)| *name).collect();
    let properties: Map<String, Value> = properties
        .iter()
        .map(|(name, schema)| ((*name).to_owned(), schema.clone()))
        .collect();
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// `{"tag": name, "val": payload}`, or `{"tag": name}` without a payload.
fn tagged(name: &str, payload: Option<Value>) -> Value {
    let tag = json!({"type": "string", "enum": [name]});
    match payload {
        Some(payload) => tagged_object(&[("tag", tag), ("val", payload)]),
        None => tagged_object(&[("tag", tag)]),
    }
}

/// Adds `text` as the schema's description (after any it has).
fn describe(schema: &mut Value, text: &str) {
    let text = text.trim();
    if text.is_empty() {
        return;
    }
    if let Value::Object(map) = schema {
        let description = match map.get("description").and_then(Value::as_str) {
            Some(before) => format!("{text} {before}"),
            None => text.to_owned(),
        };
        map.insert("description".into(), Value::String(description));
    }
}

/// The type's doc comment and its documented cases, `case: doc; …`.
fn item_docs(docs: Option<&TypeDocs>, names: &[&str]) -> Option<String> {
    let docs = docs?;
    let items: Vec<String> = names
        .iter()
        .filter_map(|name| {
            let text = docs.item(name)?.trim().trim_end_matches('.');
            Some(format!("{name}: {text}"))
        })
        .collect();
    let own = docs.docs().map(str::trim).filter(|d| !d.is_empty());
    match (own, items.is_empty()) {
        (None, true) => None,
        (Some(own), true) => Some(own.to_owned()),
        (None, false) => Some(items.join("; ")),
        (Some(own), false) => Some(format!("{own} ({})", items.join("; "))),
    }
}
