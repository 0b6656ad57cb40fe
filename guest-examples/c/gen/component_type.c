/* The bindings in this directory are `wit-bindgen c --no-object-file`'s:
 * the component type is embedded by `wasm-tools component embed` instead
 * of an object file, and this empty function stands for the symbol the
 * bindings keep asking that object file for. */
void __component_type_object_force_link_tool_host(void);
void __component_type_object_force_link_tool_host(void) {}
