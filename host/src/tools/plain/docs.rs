//! The doc comments a component carries: its WIT package's `package-docs`
//! custom section (the format wit-component writes: a version byte, then
//! JSON), which build tools (wit-docs-inject, or this repository's
//! `guest-examples/scripts/embed-docs.py`) add to a built component.
//! Components without it are fine: their tools get generated
//! descriptions.
//!
//! Cost: one pass over the component's top-level sections at load (nested
//! modules are skipped, not parsed).

use std::collections::BTreeMap;

use serde::Deserialize;

/// The section's name.
pub(crate) const SECTION: &str = "package-docs";

/// The section format versions this reader knows.
const VERSIONS: [u8; 2] = [0, 1];

/// Largest section read; a larger one is ignored (docs are descriptions,
/// never worth megabytes).
const MAX_SECTION_BYTES: usize = 1 << 20;

/// A package's docs: for its worlds and interfaces, by name.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct PackageDocs {
    worlds: BTreeMap<String, WorldDocs>,
    interfaces: BTreeMap<String, InterfaceDocs>,
    /// The component's own named types (a world's types, which the
    /// component imports) by their shape ([`shape`]): wasmtime's view of a
    /// component keeps no type imports, so their names are read here.
    /// Indexed by shape: a name, or `None` when several types share the
    /// shape (then none gets docs).
    #[serde(skip)]
    world_types: std::collections::HashMap<String, Option<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WorldDocs {
    /// Inline interfaces, imported or exported.
    interfaces: BTreeMap<String, InterfaceDocs>,
    interface_exports: BTreeMap<String, InterfaceDocs>,
    /// Functions, imported or exported.
    funcs: BTreeMap<String, FuncDocs>,
    func_exports: BTreeMap<String, FuncDocs>,
    types: BTreeMap<String, TypeDocs>,
}

/// An interface's docs.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct InterfaceDocs {
    docs: Option<String>,
    funcs: BTreeMap<String, FuncDocs>,
    types: BTreeMap<String, TypeDocs>,
}

/// A function's docs: a string (format 0) or an object (format 1).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FuncDocs {
    Text(Option<String>),
    Object {
        #[serde(default)]
        docs: Option<String>,
    },
}

impl FuncDocs {
    fn text(&self) -> Option<&str> {
        match self {
            FuncDocs::Text(docs) | FuncDocs::Object { docs } => docs.as_deref(),
        }
    }
}

/// A named type's docs, and its items' (fields, cases, flags).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct TypeDocs {
    docs: Option<String>,
    items: BTreeMap<String, String>,
}

impl TypeDocs {
    /// The type's own doc comment.
    pub(crate) fn docs(&self) -> Option<&str> {
        self.docs.as_deref()
    }

    /// The doc comment of its field, case or flag `item`.
    pub(crate) fn item(&self, item: &str) -> Option<&str> {
        self.items.get(item).map(String::as_str)
    }
}

/// Where a function was exported: at the world's level, or by an
/// interface (by its short name, `tools` for `acme:text/tools@1.0.0`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scope<'a> {
    World,
    Interface(&'a str),
}

impl PackageDocs {
    /// The docs of the component `bytes`, if it carries a readable
    /// `package-docs` section at its top level.
    pub(crate) fn of(bytes: &[u8]) -> Option<Self> {
        let top = top_level(bytes, SECTION)?;
        let data = top.section?;
        let (version, json) = data.split_first()?;
        if !VERSIONS.contains(version) || data.len() > MAX_SECTION_BYTES {
            tracing::debug!(
                version,
                "ignoring a package-docs section this Airlock cannot read"
            );
            return None;
        }
        let mut docs: Self = serde_json::from_slice(json)
            .map_err(|e| tracing::debug!(error = %e, "ignoring a malformed package-docs section"))
            .ok()?;
        for (name, shape) in top.types {
            docs.world_types
                .entry(shape)
                .and_modify(|named| *named = None)
                .or_insert(Some(name));
        }
        Some(docs)
    }

    /// The name of the world-level type whose shape is `shape`, when one
    /// type has it.
    pub(crate) fn world_type(&self, shape: &str) -> Option<&str> {
        self.world_types.get(shape)?.as_deref()
    }

    fn interface(&self, name: &str) -> Option<&InterfaceDocs> {
        self.interfaces.get(name).or_else(|| {
            self.worlds.values().find_map(|w| {
                w.interface_exports
                    .get(name)
                    .or_else(|| w.interfaces.get(name))
            })
        })
    }

    /// The doc comment of function `name` in `scope`.
    pub(crate) fn function(&self, scope: Scope<'_>, name: &str) -> Option<&str> {
        match scope {
            Scope::Interface(interface) => self.interface(interface)?.funcs.get(name)?.text(),
            Scope::World => self.worlds.values().find_map(|w| {
                w.func_exports
                    .get(name)
                    .or_else(|| w.funcs.get(name))
                    .and_then(FuncDocs::text)
            }),
        }
    }

    /// The docs of the interface named `name`, if any.
    pub(crate) fn interface_docs(&self, name: &str) -> Option<&str> {
        self.interface(name)?.docs.as_deref()
    }

    /// The docs of type `name` in `scope`.
    pub(crate) fn ty(&self, scope: Scope<'_>, name: &str) -> Option<&TypeDocs> {
        match scope {
            Scope::Interface(interface) => self.interface(interface)?.types.get(name),
            Scope::World => self.worlds.values().find_map(|w| w.types.get(name)),
        }
    }
}

/// What the top level of a component says: a custom section's payload,
/// and the names of the types it imports or exports with their shapes.
struct TopLevel<'a> {
    section: Option<&'a [u8]>,
    types: Vec<(String, String)>,
}

/// A record's, variant's, enum's or flags' shape: its kind and its
/// fields' or cases' names (`enum:red,green,blue`). Two types of a scope
/// rarely share one; when they do, neither gets docs.
pub(crate) fn shape(ty: &wasmtime::component::Type) -> Option<String> {
    use wasmtime::component::Type;
    let (kind, names): (&str, Vec<&str>) = match ty {
        Type::Record(r) => ("record", r.fields().map(|f| f.name).collect()),
        Type::Variant(v) => ("variant", v.cases().map(|c| c.name).collect()),
        Type::Enum(e) => ("enum", e.names().collect()),
        Type::Flags(f) => ("flags", f.names().collect()),
        _ => return None,
    };
    Some(format!("{kind}:{}", names.join(",")))
}

fn defined_shape(ty: &wasmparser::ComponentDefinedType<'_>) -> Option<String> {
    use wasmparser::ComponentDefinedType as D;
    let (kind, names): (&str, Vec<&str>) = match ty {
        D::Record(fields) => ("record", fields.iter().map(|(n, _)| *n).collect()),
        D::Variant(cases) => ("variant", cases.iter().map(|c| c.name).collect()),
        D::Enum(names) => ("enum", names.to_vec()),
        D::Flags(names) => ("flags", names.to_vec()),
        _ => return None,
    };
    Some(format!("{kind}:{}", names.join(",")))
}

/// Reads the top level of the wasm binary `bytes` (not inside a nested
/// module or component): the first custom section named `name`, and its
/// type index space, as far as named types go.
fn top_level<'a>(bytes: &'a [u8], name: &str) -> Option<TopLevel<'a>> {
    use wasmparser::{
        ComponentAlias, ComponentExternalKind, ComponentTypeRef, Payload, TypeBounds,
    };
    let mut top = TopLevel {
        section: None,
        types: Vec::new(),
    };
    // The component's type index space: each type's shape, if named-able.
    let mut space: Vec<Option<String>> = Vec::new();
    let mut parser = wasmparser::Parser::new(0);
    let mut offset = 0;
    loop {
        let rest = bytes.get(offset..)?;
        let (consumed, payload) = match parser.parse(rest, true).ok()? {
            wasmparser::Chunk::NeedMoreData(_) => return None,
            wasmparser::Chunk::Parsed { consumed, payload } => (consumed, payload),
        };
        offset += consumed;
        match payload {
            Payload::CustomSection(section) if section.name() == name && top.section.is_none() => {
                top.section = Some(section.data());
            }
            Payload::ComponentTypeSection(types) => {
                for ty in types.into_iter().flatten() {
                    space.push(match &ty {
                        wasmparser::ComponentType::Defined(defined) => defined_shape(defined),
                        _ => None,
                    });
                }
            }
            Payload::ComponentImportSection(imports) => {
                for import in imports.into_iter().flatten() {
                    if let ComponentTypeRef::Type(bounds) = import.ty {
                        let shape = match bounds {
                            TypeBounds::Eq(index) => space.get(index as usize).cloned().flatten(),
                            TypeBounds::SubResource => None,
                        };
                        if let Some(shape) = &shape {
                            top.types.push((import.name.name.to_owned(), shape.clone()));
                        }
                        space.push(shape);
                    }
                }
            }
            Payload::ComponentExportSection(exports) => {
                for export in exports.into_iter().flatten() {
                    if export.kind == ComponentExternalKind::Type {
                        let shape = space.get(export.index as usize).cloned().flatten();
                        if let Some(shape) = &shape {
                            top.types.push((export.name.name.to_owned(), shape.clone()));
                        }
                        space.push(shape);
                    }
                }
            }
            Payload::ComponentAliasSection(aliases) => {
                for alias in aliases.into_iter().flatten() {
                    let is_type = match alias {
                        ComponentAlias::InstanceExport { kind, .. } => {
                            kind == ComponentExternalKind::Type
                        }
                        ComponentAlias::Outer { kind, .. } => {
                            kind == wasmparser::ComponentOuterAliasKind::Type
                        }
                        ComponentAlias::CoreInstanceExport { .. } => false,
                    };
                    if is_type {
                        space.push(None);
                    }
                }
            }
            // Nested modules and components are skipped whole: the parser
            // is already past them, only the header was consumed.
            Payload::ModuleSection {
                unchecked_range, ..
            }
            | Payload::ComponentSection {
                unchecked_range, ..
            } => offset = unchecked_range.end,
            Payload::End(_) => return Some(top),
            _ => {}
        }
        if offset >= bytes.len() {
            return Some(top);
        }
    }
}
