//! Plain components: any component that does not export Airlock's `tool`
//! interface is a tool host all the same. Each function it exports (at the
//! world's level, or in an exported interface at any depth) is a tool whose
//! input schema comes from its WIT types ([`schema`]); its arguments and
//! result cross by the same mapping (`value`).
//!
//! Such a tool gets no context view and returns no ops: it is a function of
//! its arguments (and of what its grants let it reach). A function whose
//! types cannot cross as JSON (resources, futures, streams) is skipped with
//! its reason, and the component's other functions are offered.

pub(crate) mod docs;
pub mod schema;
pub(crate) mod value;

use std::rc::Rc;

use serde::Serialize;
use serde_json::Value;
use wasmtime::Engine;
use wasmtime::component::types::{ComponentFunc, ComponentItem};
use wasmtime::component::{Component, ComponentExportIndex, Type};

use docs::{PackageDocs, Scope};
use schema::{Builder, NamedTypes, Names, unsupported};

use crate::spec::{MAX_TOOLS, MAX_TOTAL_SCHEMA_BYTES};

/// The interface every Airlock-world component exports; a component that
/// exports it is an Airlock tool, whatever else it exports.
const AIRLOCK_TOOL: &str = "airlock:tool/tool@";

/// Whether `component` exports Airlock's `tool` interface.
pub(crate) fn is_airlock_tool(component: &Component, engine: &Engine) -> bool {
    component
        .component_type()
        .exports(engine)
        .any(|(name, _)| name.starts_with(AIRLOCK_TOOL))
}

/// One exported function offered as a tool.
#[derive(Debug, Clone)]
pub struct Function {
    /// The exported instances it sits in, outermost first (none: exported
    /// at the world's level), as named in the component
    /// (`acme:text/tools@0.1.0`).
    pub(crate) instances: Vec<String>,
    /// Its name, as in WIT (`count-words`).
    pub(crate) name: String,
    pub(crate) index: ComponentExportIndex,
    pub(crate) params: Vec<(String, Type)>,
    pub(crate) result: Option<Type>,
    /// Its input schema.
    pub(crate) parameters: Value,
    /// Its doc comment, or a generated one naming its interface.
    pub(crate) description: String,
}

impl Function {
    /// Its place in the component: `count-words`, or
    /// `acme:text/tools@0.1.0#count-words`.
    pub fn qualified(&self) -> String {
        match self.instances.as_slice() {
            [] => self.name.clone(),
            instances => format!("{}#{}", instances.join("/"), self.name),
        }
    }

    /// The innermost interface's name without package or version (`tools`
    /// for `acme:text/tools@0.1.0`), if it is in one.
    fn interface_short(&self) -> Option<&str> {
        self.instances.last().map(|i| short_interface(i))
    }

    /// Whether `selector` (from a policy's `functions` or `rename`) names
    /// this function: its name, or `INTERFACE#name` where `INTERFACE` is the
    /// interface as exported, without its version, or its short name.
    pub(crate) fn matches(&self, selector: &str) -> bool {
        let Some((interface, name)) = selector.rsplit_once('#') else {
            return selector == self.name;
        };
        let Some(mine) = self.instances.last() else {
            return false;
        };
        name == self.name
            && (interface == mine
                || interface == without_version(mine)
                || interface == short_interface(mine))
    }

    /// The names this function may take as a tool, in order of preference:
    /// its own, then with its interface's short name, then with its
    /// interface's full name (every character not allowed in a tool name
    /// written as `_`; over 64 characters, shortened with a hash).
    pub(crate) fn candidate_names(&self) -> Vec<String> {
        let mut names = vec![tool_name(&self.name)];
        if let Some(short) = self.interface_short() {
            names.push(tool_name(&format!("{short}_{}", self.name)));
            names.push(tool_name(&format!(
                "{}_{}",
                self.instances.join("_"),
                self.name
            )));
        }
        names.dedup();
        names
    }
}

/// A function not offered as a tool, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// Its place in the component ([`Function::qualified`]'s form).
    pub function: String,
    /// Why it is not a tool.
    pub reason: String,
}

/// `acme:text/tools@0.1.0` → `acme:text/tools`.
fn without_version(interface: &str) -> &str {
    interface.split('@').next().unwrap_or(interface)
}

/// `acme:text/tools@0.1.0` → `tools`.
fn short_interface(interface: &str) -> &str {
    let unversioned = without_version(interface);
    unversioned.rsplit(['/', ':']).next().unwrap_or(unversioned)
}

/// `text` as a tool name (`^[a-zA-Z0-9_-]{1,64}$`): other characters
/// become `_` (without leading or trailing ones); a name over 64
/// characters keeps its first 55 and a hash of the whole.
pub(crate) fn tool_name(text: &str) -> String {
    let mapped: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mapped = mapped.trim_matches('_');
    let mapped = if mapped.is_empty() {
        "function"
    } else {
        mapped
    };
    if mapped.len() <= 64 {
        return mapped.to_owned();
    }
    use sha2::Digest;
    let hash = hex::encode(sha2::Sha256::digest(text.as_bytes()));
    format!("{}_{}", &mapped[..55], &hash[..8])
}

/// Most functions a component may export, offered or skipped: past it,
/// the component is refused before any schema is built.
pub const MAX_FUNCTIONS: usize = 4 * MAX_TOOLS;

/// Why a plain component offers nothing: more than it may ask of the host
/// while its tools are described.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TooMuch {
    /// More functions than a component may offer as tools.
    #[error(
        "it exports more than {max} functions that could be tools, the most one component may offer"
    )]
    Tools {
        /// [`MAX_TOOLS`].
        max: usize,
    },
    /// More functions than a component may export.
    #[error("it exports more than {max} functions")]
    Functions {
        /// [`MAX_FUNCTIONS`].
        max: usize,
    },
    /// Its tools' schemas together are too large.
    #[error("its functions' parameter schemas add up to more than {max} bytes")]
    Schemas {
        /// [`MAX_TOTAL_SCHEMA_BYTES`].
        max: usize,
    },
}

/// The functions `component` exports, at any depth: those offered as tools
/// (with schemas no larger than `max_schema_bytes` each and
/// [`MAX_TOTAL_SCHEMA_BYTES`] together, descriptions from `docs`) and
/// those skipped, with why. The exports are walked first, cheaply; a
/// component of more than [`MAX_TOOLS`] functions that could be tools (or
/// [`MAX_FUNCTIONS`] in all) is refused before any schema is built, and
/// building stops once the schemas reach their total: the work is bounded
/// whatever the component declares.
pub(crate) fn functions(
    component: &Component,
    engine: &Engine,
    docs: Option<&PackageDocs>,
    max_schema_bytes: usize,
) -> Result<(Vec<Function>, Vec<Skipped>), TooMuch> {
    let mut walk = Walk {
        component,
        engine,
        found: Vec::new(),
        skipped: Vec::new(),
    };
    let ty = component.component_type();
    let exports: Vec<(String, ComponentItem)> = ty
        .exports(engine)
        .map(|(name, export)| (name.to_owned(), export.ty))
        .collect();
    // A world's own types (what its world-level functions use) are among
    // the component's imports.
    let world_types: Vec<(Type, String)> = ty
        .imports(engine)
        .filter_map(|(name, import)| match import.ty {
            ComponentItem::Type(ty) => Some((ty, name.to_owned())),
            _ => None,
        })
        .collect();
    walk.scope(&[], None, exports, world_types)?;
    let Walk {
        found, mut skipped, ..
    } = walk;
    let mut offered = Vec::with_capacity(found.len());
    let mut left = MAX_TOTAL_SCHEMA_BYTES;
    for found in found {
        let budget = max_schema_bytes.min(left);
        match found.offer(docs, budget) {
            Ok(function) => {
                left -= crate::json::len(&function.parameters).min(left);
                offered.push(function);
            }
            Err(_) if budget < max_schema_bytes => {
                return Err(TooMuch::Schemas {
                    max: MAX_TOTAL_SCHEMA_BYTES,
                });
            }
            Err(skip) => skipped.push(skip),
        }
    }
    Ok((offered, skipped))
}

/// Deepest nesting of exported instances looked into.
const MAX_INSTANCE_DEPTH: usize = 16;

struct Walk<'a> {
    component: &'a Component,
    engine: &'a Engine,
    /// The functions whose types can cross, not yet described.
    found: Vec<Found>,
    skipped: Vec<Skipped>,
}

/// A function whose types can cross as JSON, before its schema is built.
struct Found {
    instances: Vec<String>,
    name: String,
    index: ComponentExportIndex,
    params: Vec<(String, Type)>,
    result: Option<Type>,
    /// The named types of its scope, shared with the scope's other
    /// functions.
    named: Rc<NamedTypes>,
}

impl Walk<'_> {
    /// The functions among `exports`, the exports of the instance at
    /// `instances` (whose export index is `parent`), and of the instances
    /// it exports.
    fn scope(
        &mut self,
        instances: &[String],
        parent: Option<ComponentExportIndex>,
        exports: Vec<(String, ComponentItem)>,
        mut named: Vec<(Type, String)>,
    ) -> Result<(), TooMuch> {
        named.extend(exports.iter().filter_map(|(name, item)| match item {
            ComponentItem::Type(ty) => Some((ty.clone(), name.clone())),
            _ => None,
        }));
        let named = Rc::new(NamedTypes::new(named));
        for (name, item) in exports {
            match item {
                ComponentItem::ComponentFunc(func) => {
                    let Some(index) = self.component.get_export_index(parent.as_ref(), &name)
                    else {
                        continue;
                    };
                    self.function(instances, name, index, &func, &named)?;
                }
                ComponentItem::ComponentInstance(instance) => {
                    let mut inner = instances.to_vec();
                    inner.push(name.clone());
                    if inner.len() > MAX_INSTANCE_DEPTH {
                        self.skipped.push(Skipped {
                            function: format!("{}#*", inner.join("/")),
                            reason: format!(
                                "its instances nest deeper than {MAX_INSTANCE_DEPTH} levels"
                            ),
                        });
                        continue;
                    }
                    let Some(index) = self.component.get_export_index(parent.as_ref(), &name)
                    else {
                        continue;
                    };
                    let exports = instance
                        .exports(self.engine)
                        .map(|(name, export)| (name.to_owned(), export.ty))
                        .collect();
                    self.scope(&inner, Some(index), exports, Vec::new())?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn function(
        &mut self,
        instances: &[String],
        name: String,
        index: ComponentExportIndex,
        func: &ComponentFunc,
        named: &Rc<NamedTypes>,
    ) -> Result<(), TooMuch> {
        if self.found.len() + self.skipped.len() >= MAX_FUNCTIONS {
            return Err(TooMuch::Functions { max: MAX_FUNCTIONS });
        }
        let params: Vec<(String, Type)> = func
            .params()
            .map(|(name, ty)| (name.to_owned(), ty))
            .collect();
        let results: Vec<Type> = func.results().collect();
        let problem = if func.async_() {
            Some("it is an async function, which this host does not call".to_owned())
        } else if results.len() > 1 {
            Some("it returns several values".to_owned())
        } else {
            params
                .iter()
                .find_map(|(p, ty)| unsupported(ty).map(|why| format!("parameter `{p}`: {why}")))
                .or_else(|| {
                    results
                        .first()
                        .and_then(unsupported)
                        .map(|why| format!("its result: {why}"))
                })
        };
        if let Some(reason) = problem {
            self.skipped.push(Skipped {
                function: qualified(instances, &name),
                reason,
            });
            return Ok(());
        }
        if self.found.len() >= MAX_TOOLS {
            return Err(TooMuch::Tools { max: MAX_TOOLS });
        }
        self.found.push(Found {
            instances: instances.to_vec(),
            name,
            index,
            params,
            result: results.into_iter().next(),
            named: Rc::clone(named),
        });
        Ok(())
    }
}

/// `name`'s place in the component: `name`, or `INSTANCE/…#name`.
fn qualified(instances: &[String], name: &str) -> String {
    match instances {
        [] => name.to_owned(),
        _ => format!("{}#{name}", instances.join("/")),
    }
}

impl Found {
    /// The function as a tool: its schema (within `max_schema_bytes`) and
    /// description; skipped, with why, when its schema would be larger.
    fn offer(
        self,
        docs: Option<&PackageDocs>,
        max_schema_bytes: usize,
    ) -> Result<Function, Skipped> {
        let scope = match self.instances.last() {
            Some(instance) => Scope::Interface(short_interface(instance)),
            None => Scope::World,
        };
        let names = Names {
            types: &self.named,
            docs,
            scope,
        };
        let parameters = match Builder::new(names, max_schema_bytes)
            .parameters(self.params.iter().map(|(n, t)| (n.as_str(), t)))
        {
            Ok(schema) if crate::json::len(&schema) <= max_schema_bytes => schema,
            _ => {
                return Err(Skipped {
                    function: qualified(&self.instances, &self.name),
                    reason: format!(
                        "its parameters' schema would be over {max_schema_bytes} bytes"
                    ),
                });
            }
        };
        let documented = docs
            .and_then(|d| d.function(scope, &self.name))
            .map(str::trim)
            .filter(|d| !d.is_empty());
        let description = match (documented, self.instances.last()) {
            (Some(docs), _) => docs.to_owned(),
            (None, Some(interface)) => {
                let about = docs
                    .and_then(|d| d.interface_docs(short_interface(interface)))
                    .map(|d| format!(" ({})", d.trim()))
                    .unwrap_or_default();
                format!(
                    "The function `{}` of the interface `{interface}`{about}.",
                    self.name
                )
            }
            (None, None) => format!("The function `{}`, exported by the component.", self.name),
        };
        Ok(Function {
            instances: self.instances,
            name: self.name,
            index: self.index,
            params: self.params,
            result: self.result,
            parameters,
            description: crate::text::truncate(&description, crate::spec::MAX_DESCRIPTION_BYTES),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_are_valid_and_deterministic() {
        assert_eq!(tool_name("count-words"), "count-words");
        assert_eq!(
            tool_name("[static]counter.version"),
            "static_counter_version"
        );
        assert_eq!(
            tool_name("acme:text/tools@0.1.0_count"),
            "acme_text_tools_0_1_0_count"
        );
        let long = "x".repeat(100);
        let named = tool_name(&long);
        assert_eq!(named.len(), 64);
        assert_eq!(named, tool_name(&long));
        assert_ne!(named, tool_name(&"x".repeat(101)));
        assert_eq!(tool_name("..."), "function");
        assert_eq!(short_interface("acme:text/tools@0.1.0"), "tools");
        assert_eq!(short_interface("run"), "run");
    }
}
