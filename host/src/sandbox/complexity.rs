//! What a component may ask of the compiler, checked before it compiles.
//!
//! Cranelift's cost is about linear in code size except where a function
//! has many locals and many control-flow merge points (blocks, loops,
//! `if`s): building SSA form gives each merge point a parameter per local
//! live across it, and register allocation then works on all of them. A
//! 22 KB function of 2,000 locals and 2,000 loops takes 2 s and 430 MB to
//! compile; twice each, four times that. So each function's *weight* —
//! (locals + 1) × (merge points + 1), the most such parameters it can make
//! the compiler build — is bounded, and so is the weight of all of them.
//! The bounds are far above what compilers emit: the largest function of
//! the CPython interpreter (componentize-py) weighs 68,000, of
//! SpiderMonkey (componentize-js) 202,419, and the whole of either under
//! 3.3 million.
//!
//! This runs on every path that compiles (in process or in a child), on a
//! cache miss only, and costs one pass over the code (about 0.1 s for an
//! 18 MB component). Input the parser rejects is left to the compiler,
//! which rejects it too, with its own message.

use wasmparser::{Operator, Parser, Payload};

/// The most one function may weigh (see the module documentation): ten
/// times the heaviest function seen in real components; a function of
/// this weight compiles in about a second.
pub const MAX_FUNCTION_WEIGHT: u64 = 2_000_000;

/// The most all of a component's functions may weigh together, before the
/// allowance for its size: a few seconds of compiling at worst.
pub const BASE_TOTAL_WEIGHT: u64 = 8_000_000;

/// Weight allowed per byte of component, on top of [`BASE_TOTAL_WEIGHT`]:
/// an 18 MB component may weigh 26 million (CPython weighs 1.6 million).
pub const TOTAL_WEIGHT_PER_BYTE: u64 = 1;

/// The most names a component may declare (exports, imports, and the
/// exports its instance and component types list), each of which the
/// engine and the host walk: far above real components (a componentize-py
/// tool declares 285, most of them WASI's), far below what makes loading
/// costly (a component exporting one function under 100,000 names took
/// 24 s and 1.1 GB to load as 100,000 tools).
pub const MAX_NAMES: usize = 4096;

/// The longest name a component may declare (WIT names are identifiers,
/// interface names a few dozen bytes).
pub const MAX_NAME_BYTES: usize = 1024;

/// Why a component is refused before it is compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TooComplex {
    /// One function asks too much.
    #[error(
        "function {function} of core module {module} has {locals} locals and {merges} blocks, \
         loops and ifs: a weight of {weight} (locals × merge points) is past the {max} a \
         function may have; it is not compiled"
    )]
    Function {
        /// Its core module, counted from 0 in the order the component holds them.
        module: usize,
        /// Its index among the module's defined functions.
        function: usize,
        /// Its locals (parameters not counted).
        locals: u64,
        /// Its blocks, loops, `if`s and `else`s.
        merges: u64,
        /// `(locals + 1) × (merges + 1)`.
        weight: u64,
        /// [`MAX_FUNCTION_WEIGHT`].
        max: u64,
    },
    /// It declares too many names.
    #[error(
        "it declares more than {max} names (exports, imports and the exports of its types); it \
         is not compiled"
    )]
    Names {
        /// [`MAX_NAMES`].
        max: usize,
    },
    /// One of its names is too long.
    #[error(
        "it declares a name of {length} bytes, past the {max} a name may have; it is not compiled"
    )]
    NameLength {
        /// The name's length.
        length: usize,
        /// [`MAX_NAME_BYTES`].
        max: usize,
    },
    /// All its functions together ask too much.
    #[error(
        "its functions weigh {weight} together (locals × merge points), past the {max} a \
         component of {bytes} bytes may; it is not compiled"
    )]
    Total {
        /// The sum over every function.
        weight: u64,
        /// The bound for this size.
        max: u64,
        /// The component's size.
        bytes: usize,
    },
}

/// Checks `bytes` (a component or a core module) against the bounds.
pub fn check(bytes: &[u8]) -> Result<(), TooComplex> {
    let max_total =
        BASE_TOTAL_WEIGHT.saturating_add(TOTAL_WEIGHT_PER_BYTE.saturating_mul(bytes.len() as u64));
    let mut total: u64 = 0;
    let (mut module, mut function) = (0usize, 0usize);
    let mut modules_seen = 0usize;
    let mut names = Names::default();
    for payload in Parser::new(0).parse_all(bytes) {
        let Ok(payload) = payload else {
            return Ok(());
        };
        names.count(&payload)?;
        match payload {
            Payload::CodeSectionStart { .. } => {
                module = modules_seen;
                modules_seen += 1;
                function = 0;
            }
            Payload::CodeSectionEntry(body) => {
                let Some((locals, merges)) = measure(&body) else {
                    return Ok(());
                };
                let weight = (locals + 1).saturating_mul(merges + 1);
                if weight > MAX_FUNCTION_WEIGHT {
                    return Err(TooComplex::Function {
                        module,
                        function,
                        locals,
                        merges,
                        weight,
                        max: MAX_FUNCTION_WEIGHT,
                    });
                }
                total = total.saturating_add(weight);
                function += 1;
            }
            _ => {}
        }
    }
    if total > max_total {
        return Err(TooComplex::Total {
            weight: total,
            max: max_total,
            bytes: bytes.len(),
        });
    }
    Ok(())
}

/// The names a component's sections declare, counted as they are parsed.
#[derive(Default)]
struct Names {
    count: usize,
}

impl Names {
    fn add(&mut self, name: &str) -> Result<(), TooComplex> {
        if name.len() > MAX_NAME_BYTES {
            return Err(TooComplex::NameLength {
                length: name.len(),
                max: MAX_NAME_BYTES,
            });
        }
        self.count += 1;
        if self.count > MAX_NAMES {
            return Err(TooComplex::Names { max: MAX_NAMES });
        }
        Ok(())
    }

    /// The names `payload` declares (what does not parse is left to the
    /// compiler).
    fn count(&mut self, payload: &Payload<'_>) -> Result<(), TooComplex> {
        use wasmparser::ComponentInstance;
        match payload {
            Payload::ComponentExportSection(section) => {
                for export in section.clone().into_iter().flatten() {
                    self.add(export.name.name)?;
                }
            }
            Payload::ComponentImportSection(section) => {
                for import in section.clone().into_iter().flatten() {
                    self.add(import.name.name)?;
                }
            }
            Payload::ComponentInstanceSection(section) => {
                for instance in section.clone().into_iter().flatten() {
                    if let ComponentInstance::FromExports(exports) = instance {
                        for export in exports.iter() {
                            self.add(export.name.name)?;
                        }
                    }
                }
            }
            Payload::ComponentTypeSection(section) => {
                for ty in section.clone().into_iter().flatten() {
                    self.ty(&ty)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The names a type declares, and the types it nests.
    fn ty(&mut self, ty: &wasmparser::ComponentType<'_>) -> Result<(), TooComplex> {
        use wasmparser::{ComponentType, ComponentTypeDeclaration, InstanceTypeDeclaration};
        match ty {
            ComponentType::Component(declarations) => {
                for declaration in declarations.iter() {
                    match declaration {
                        ComponentTypeDeclaration::Export { name, .. }
                        | ComponentTypeDeclaration::Import(wasmparser::ComponentImport {
                            name,
                            ..
                        }) => self.add(name.name)?,
                        ComponentTypeDeclaration::Type(inner) => self.ty(inner)?,
                        _ => {}
                    }
                }
            }
            ComponentType::Instance(declarations) => {
                for declaration in declarations.iter() {
                    match declaration {
                        InstanceTypeDeclaration::Export { name, .. } => self.add(name.name)?,
                        InstanceTypeDeclaration::Type(inner) => self.ty(inner)?,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// A function's locals and merge points; `None` when it does not parse.
fn measure(body: &wasmparser::FunctionBody<'_>) -> Option<(u64, u64)> {
    let mut locals: u64 = 0;
    for group in body.get_locals_reader().ok()? {
        locals = locals.saturating_add(u64::from(group.ok()?.0));
    }
    let mut merges: u64 = 0;
    let mut operators = body.get_operators_reader().ok()?;
    while !operators.eof() {
        if let Operator::Block { .. }
        | Operator::Loop { .. }
        | Operator::If { .. }
        | Operator::Else = operators.read().ok()?
        {
            merges += 1;
        }
    }
    Some((locals, merges))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A core module with one function of `locals` locals and `loops`
    /// loops, each local read after them.
    fn heavy(locals: usize, loops: usize) -> Vec<u8> {
        let mut wat = format!("(module (func (local {})", "i32 ".repeat(locals));
        wat.push_str(&"(loop local.get 0 br_if 0)".repeat(loops));
        for i in 0..locals {
            wat.push_str(&format!(" local.get {i} drop"));
        }
        wat.push_str("))");
        wat::parse_str(&wat).unwrap()
    }

    /// How many names `bytes` declares (for measuring real components).
    fn names(bytes: &[u8]) -> usize {
        let mut names = Names::default();
        for payload in Parser::new(0).parse_all(bytes).flatten() {
            let _ = names.count(&payload);
        }
        names.count
    }

    #[test]
    fn names_past_the_bound_are_refused() {
        let exports: String = (0..=MAX_NAMES)
            .map(|i| format!("(export \"f{i}\" (func 0))"))
            .collect();
        let many = wat::parse_str(format!(
            "(component (core module $m (func (export \"f\"))) (core instance $i (instantiate $m)) \
             (func (canon lift (core func $i \"f\"))) {exports})"
        ))
        .unwrap();
        assert_eq!(check(&many), Err(TooComplex::Names { max: MAX_NAMES }));
        let long = wat::parse_str(format!(
            "(component (core module $m (func (export \"f\"))) (core instance $i (instantiate $m)) \
             (func (canon lift (core func $i \"f\"))) (export \"{}\" (func 0)))",
            "a".repeat(MAX_NAME_BYTES + 1)
        ))
        .unwrap();
        assert!(matches!(check(&long), Err(TooComplex::NameLength { .. })));
        // Real components declare far fewer (when built).
        for file in [
            "python-stateful.wasm",
            "js-stateful.wasm",
            "c-stateful.wasm",
            "wasm32-wasip2/release/stateful.wasm",
            "plain/python-typed.wasm",
            "plain/typed.wasm",
        ] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/guests")
                .join(file);
            if let Ok(bytes) = std::fs::read(&path) {
                let n = names(&bytes);
                assert!(n * 8 < MAX_NAMES, "{file}: {n} names");
                assert_eq!(check(&bytes), Ok(()), "{file}");
            }
        }
    }

    #[test]
    fn a_function_of_many_locals_and_merges_is_refused_by_its_weight() {
        assert_eq!(check(&heavy(100, 100)), Ok(()));
        match check(&heavy(2000, 2000)) {
            Err(TooComplex::Function {
                module: 0,
                function: 0,
                locals: 2000,
                merges: 2000,
                weight,
                ..
            }) => assert_eq!(weight, 2001 * 2001),
            other => panic!("{other:?}"),
        }
        // What does not parse is the compiler's to refuse.
        assert_eq!(check(b"\0asm garbage"), Ok(()));
    }
}
