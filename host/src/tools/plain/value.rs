//! JSON to component values and back, by the mapping of [`super::schema`].
//!
//! Arguments are checked against the derived schema before they get here,
//! but conversion checks again and never panics: whatever a value is, the
//! answer is a value or an error naming where in the arguments it is
//! wrong (a JSON Pointer) and why, never the value itself.

use serde_json::{Map, Number, Value};
use wasmtime::component::{Type, Val};

use super::schema::nullable;

/// An argument that does not fit its type: where (a JSON Pointer into the
/// arguments) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mismatch {
    pub(crate) at: String,
    pub(crate) problem: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at {}: {}", self.at, self.problem)
    }
}

/// A JSON Pointer being built: `/point/x`.
struct Path(Vec<String>);

impl Path {
    fn at(&self) -> String {
        self.0
            .iter()
            .map(|part| format!("/{}", part.replace('~', "~0").replace('/', "~1")))
            .collect()
    }

    fn fail<T>(&self, problem: impl Into<String>) -> Result<T, Mismatch> {
        Err(Mismatch {
            at: self.at(),
            problem: problem.into(),
        })
    }

    fn within<T>(
        &mut self,
        part: impl Into<String>,
        f: impl FnOnce(&mut Self) -> Result<T, Mismatch>,
    ) -> Result<T, Mismatch> {
        self.0.push(part.into());
        let result = f(self);
        self.0.pop();
        result
    }
}

/// The values of a function's parameters from its arguments (a JSON
/// object): each parameter present and of its type, no other key. This is
/// the whole check of a plain function's arguments: it enforces exactly
/// what the derived schema says.
pub(crate) fn arguments(params: &[(String, Type)], json: Value) -> Result<Vec<Val>, Mismatch> {
    let Value::Object(map) = json else {
        return Path(Vec::new()).fail("the arguments must be a JSON object");
    };
    if let Some(extra) = map
        .keys()
        .find(|k| !params.iter().any(|(name, _)| name == *k))
    {
        return Path(vec![extra.clone()]).fail("no such parameter");
    }
    params
        .iter()
        .map(|(name, ty)| match map.get(name) {
            Some(value) => Path(vec![name.clone()]).convert(ty, value),
            None => Path(vec![name.clone()]).fail("missing parameter"),
        })
        .collect()
}

fn kind(json: &Value) -> &'static str {
    match json {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Path {
    fn convert(&mut self, ty: &Type, json: &Value) -> Result<Val, Mismatch> {
        let expected = |what: &str| format!("expected {what}, found {}", kind(json));
        Ok(match ty {
            Type::Bool => match json {
                Value::Bool(b) => Val::Bool(*b),
                _ => return self.fail(expected("a boolean")),
            },
            Type::S8 => Val::S8(self.integer(json, "s8")?),
            Type::U8 => Val::U8(self.integer(json, "u8")?),
            Type::S16 => Val::S16(self.integer(json, "s16")?),
            Type::U16 => Val::U16(self.integer(json, "u16")?),
            Type::S32 => Val::S32(self.integer(json, "s32")?),
            Type::U32 => Val::U32(self.integer(json, "u32")?),
            Type::S64 => Val::S64(self.integer(json, "s64")?),
            Type::U64 => Val::U64(self.integer(json, "u64")?),
            Type::Float64 => Val::Float64(self.number(json)?),
            Type::Float32 => {
                let n = self.number(json)?;
                // The nearest f32; a finite number past f32's range is refused
                // rather than turned into an infinity.
                #[allow(clippy::cast_possible_truncation)]
                let narrowed = n as f32;
                if narrowed.is_infinite() {
                    return self.fail("the number is out of range for f32");
                }
                Val::Float32(narrowed)
            }
            Type::Char => match json {
                Value::String(s) => {
                    let mut chars = s.chars();
                    match (chars.next(), chars.next()) {
                        (Some(c), None) => Val::Char(c),
                        _ => {
                            return self.fail(format!(
                                "expected exactly one character (a char), found {} characters",
                                s.chars().count()
                            ));
                        }
                    }
                }
                _ => return self.fail(expected("a one-character string")),
            },
            Type::String => match json {
                Value::String(s) => Val::String(s.clone()),
                _ => return self.fail(expected("a string")),
            },
            Type::List(list) => {
                let element = list.ty();
                Val::List(self.array(json, None, |path, item| path.convert(&element, item))?)
            }
            Type::FixedLengthList(list) => {
                let element = list.ty();
                let len = usize::try_from(list.len()).unwrap_or(usize::MAX);
                Val::FixedLengthList(
                    self.array(json, Some(len), |path, item| path.convert(&element, item))?,
                )
            }
            Type::Tuple(tuple) => {
                let types: Vec<Type> = tuple.types().collect();
                let mut types = types.iter();
                Val::Tuple(self.array(json, Some(tuple.types().len()), |path, item| {
                    match types.next() {
                        Some(t) => path.convert(t, item),
                        None => path.fail("too many items"),
                    }
                })?)
            }
            Type::Record(record) => {
                let Value::Object(map) = json else {
                    return self.fail(expected("an object"));
                };
                let mut fields = Vec::new();
                for field in record.fields() {
                    let Some(value) = map.get(field.name) else {
                        return self.fail(format!("missing field {:?}", field.name));
                    };
                    let val = self.within(field.name, |path| path.convert(&field.ty, value))?;
                    fields.push((field.name.to_owned(), val));
                }
                if let Some(extra) = map.keys().find(|k| !record.fields().any(|f| f.name == *k)) {
                    return self.fail(format!(
                        "unknown field {:?}",
                        crate::text::truncate(extra, 64)
                    ));
                }
                Val::Record(fields)
            }
            Type::Variant(variant) => {
                let (tag, payload) = self.tagged(json)?;
                let Some(case) = variant.cases().find(|c| c.name == tag) else {
                    let names: Vec<String> = variant.cases().map(|c| c.name.to_owned()).collect();
                    return self.fail(format!(
                        "unknown case {:?}; the cases are {}",
                        crate::text::truncate(tag, 64),
                        names.join(", ")
                    ));
                };
                let val = self.payload(case.name, case.ty.as_ref(), payload)?;
                Val::Variant(case.name.to_owned(), val)
            }
            Type::Enum(cases) => match json {
                Value::String(name) if cases.names().any(|c| c == name) => Val::Enum(name.clone()),
                Value::String(name) => {
                    let names: Vec<&str> = cases.names().collect();
                    return self.fail(format!(
                        "unknown case {:?}; the cases are {}",
                        crate::text::truncate(name, 64),
                        names.join(", ")
                    ));
                }
                _ => return self.fail(expected("a case name (a string)")),
            },
            Type::Flags(flags) => {
                let mut set: Vec<String> = Vec::new();
                self.array(json, None, |path, item| {
                    let Value::String(name) = item else {
                        return path.fail(format!("expected a flag name, found {}", kind(item)));
                    };
                    if !flags.names().any(|f| f == name) {
                        let names: Vec<&str> = flags.names().collect();
                        return path.fail(format!(
                            "unknown flag {:?}; the flags are {}",
                            crate::text::truncate(name, 64),
                            names.join(", ")
                        ));
                    }
                    if set.contains(name) {
                        return path.fail(format!("flag {name:?} is set twice"));
                    }
                    set.push(name.clone());
                    Ok(())
                })?;
                Val::Flags(set)
            }
            Type::Option(option) => {
                let inner = option.ty();
                match json {
                    Value::Null => Val::Option(None),
                    _ if nullable(&inner) => {
                        let Value::Object(map) = json else {
                            return self.fail(expected("null or {\"some\": …}"));
                        };
                        if map.len() != 1 {
                            return self.fail("expected null or an object with only \"some\"");
                        }
                        let Some(value) = map.get("some") else {
                            return self.fail("expected null or {\"some\": …}");
                        };
                        let val = self.within("some", |path| path.convert(&inner, value))?;
                        Val::Option(Some(Box::new(val)))
                    }
                    _ => Val::Option(Some(Box::new(self.convert(&inner, json)?))),
                }
            }
            Type::Result(result) => {
                let (tag, payload) = self.tagged(json)?;
                match tag {
                    "ok" => Val::Result(Ok(self.payload("ok", result.ok().as_ref(), payload)?)),
                    "err" => {
                        Val::Result(Err(self.payload("err", result.err().as_ref(), payload)?))
                    }
                    other => {
                        return self.fail(format!(
                            "unknown case {:?}; the cases are ok, err",
                            crate::text::truncate(other, 64)
                        ));
                    }
                }
            }
            Type::Own(_)
            | Type::Borrow(_)
            | Type::Future(_)
            | Type::Stream(_)
            | Type::ErrorContext
            | Type::Map(_) => return self.fail("this type cannot be given as JSON"),
        })
    }

    fn integer<T: TryFrom<i64> + TryFrom<u64>>(
        &self,
        json: &Value,
        name: &str,
    ) -> Result<T, Mismatch> {
        let Value::Number(n) = json else {
            return self.fail(format!(
                "expected a whole number ({name}), found {}",
                kind(json)
            ));
        };
        let fits = match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => T::try_from(i).ok(),
            (None, Some(u)) => T::try_from(u).ok(),
            (None, None) => {
                return self.fail(format!(
                    "expected a whole number ({name}), found a fraction"
                ));
            }
        };
        fits.map_or_else(
            || self.fail(format!("the number is out of range for {name}")),
            Ok,
        )
    }

    fn number(&self, json: &Value) -> Result<f64, Mismatch> {
        match json {
            Value::Number(n) => n
                .as_f64()
                .map_or_else(|| self.fail("expected a number"), Ok),
            _ => self.fail(format!("expected a number, found {}", kind(json))),
        }
    }

    /// Each item of an array (of exactly `len` items, when given).
    fn array<T>(
        &mut self,
        json: &Value,
        len: Option<usize>,
        mut each: impl FnMut(&mut Self, &Value) -> Result<T, Mismatch>,
    ) -> Result<Vec<T>, Mismatch> {
        let Value::Array(items) = json else {
            return self.fail(format!("expected an array, found {}", kind(json)));
        };
        if let Some(len) = len
            && items.len() != len
        {
            return self.fail(format!(
                "expected exactly {len} items, found {}",
                items.len()
            ));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, item)| self.within(i.to_string(), |path| each(path, item)))
            .collect()
    }

    /// A `{"tag", "val"}` object's tag and payload.
    fn tagged<'j>(&self, json: &'j Value) -> Result<(&'j str, Option<&'j Value>), Mismatch> {
        let Value::Object(map) = json else {
            return self.fail(format!(
                "expected {{\"tag\": …, \"val\": …}}, found {}",
                kind(json)
            ));
        };
        let Some(Value::String(tag)) = map.get("tag") else {
            return self.fail("expected a \"tag\" naming the case");
        };
        if let Some(extra) = map.keys().find(|k| *k != "tag" && *k != "val") {
            return self.fail(format!(
                "unknown field {:?}",
                crate::text::truncate(extra, 64)
            ));
        }
        Ok((tag, map.get("val")))
    }

    /// A case's payload: present exactly when the case has a payload type.
    fn payload(
        &mut self,
        case: &str,
        ty: Option<&Type>,
        json: Option<&Value>,
    ) -> Result<Option<Box<Val>>, Mismatch> {
        match (ty, json) {
            (Some(ty), Some(value)) => Ok(Some(Box::new(
                self.within("val", |path| path.convert(ty, value))?,
            ))),
            (None, None) => Ok(None),
            (Some(_), None) => self.fail(format!("case {case:?} needs a \"val\"")),
            (None, Some(_)) => self.fail(format!("case {case:?} takes no \"val\"")),
        }
    }
}

/// The JSON of a value a function returned.
pub(crate) fn to_json(val: &Val) -> Value {
    match val {
        Val::Bool(b) => Value::Bool(*b),
        Val::S8(n) => Value::from(*n),
        Val::U8(n) => Value::from(*n),
        Val::S16(n) => Value::from(*n),
        Val::U16(n) => Value::from(*n),
        Val::S32(n) => Value::from(*n),
        Val::U32(n) => Value::from(*n),
        Val::S64(n) => Value::from(*n),
        Val::U64(n) => Value::from(*n),
        // The shortest decimal that reads back as the same f32 (0.1, not
        // 0.10000000149011612).
        Val::Float32(n) => float(n.to_string().parse().unwrap_or(f64::from(*n))),
        Val::Float64(n) => float(*n),
        Val::Char(c) => Value::String(c.to_string()),
        Val::String(s) => Value::String(s.clone()),
        Val::List(items) | Val::Tuple(items) | Val::FixedLengthList(items) => {
            Value::Array(items.iter().map(to_json).collect())
        }
        Val::Record(fields) => Value::Object(
            fields
                .iter()
                .map(|(name, val)| (name.clone(), to_json(val)))
                .collect(),
        ),
        Val::Variant(case, payload) => tagged(case, payload.as_deref()),
        Val::Enum(case) => Value::String(case.clone()),
        Val::Option(None) => Value::Null,
        Val::Option(Some(inner)) => match **inner {
            Val::Option(_) => {
                let mut map = Map::new();
                map.insert("some".into(), to_json(inner));
                Value::Object(map)
            }
            _ => to_json(inner),
        },
        Val::Result(Ok(payload)) => tagged("ok", payload.as_deref()),
        Val::Result(Err(payload)) => tagged("err", payload.as_deref()),
        Val::Flags(names) => Value::Array(names.iter().cloned().map(Value::String).collect()),
        // Functions that pass these are never offered.
        Val::Map(_) | Val::Resource(_) | Val::Future(_) | Val::Stream(_) | Val::ErrorContext(_) => {
            Value::Null
        }
    }
}

/// A float as JSON: non-finite ones (which JSON cannot hold) as strings.
fn float(n: f64) -> Value {
    match Number::from_f64(n) {
        Some(number) => Value::Number(number),
        None if n.is_nan() => Value::String("NaN".into()),
        None if n > 0.0 => Value::String("Infinity".into()),
        None => Value::String("-Infinity".into()),
    }
}

fn tagged(tag: &str, payload: Option<&Val>) -> Value {
    let mut map = Map::new();
    map.insert("tag".into(), Value::String(tag.to_owned()));
    if let Some(payload) = payload {
        map.insert("val".into(), to_json(payload));
    }
    Value::Object(map)
}
