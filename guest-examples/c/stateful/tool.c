/* The stateful walkthrough in C: the same three tools as the Rust example,
 * with the same results, ops and errors (tests/all/conformance.rs checks
 * it). Bindings come from `wit-bindgen c wit -w tool-host`; see the
 * Makefile target `guests-c` for the build. */

#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "tool_host.h"

typedef airlock_tool_types_tool_error_t tool_error_t;

static const char *SPECS[][3] = {
  {"increment", "Add 1 to the counter with the given name and return its new value.",
   "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"description\":\"Counter name\"}},"
   "\"required\":[\"name\"],\"additionalProperties\":false}"},
  {"add_note", "Append a note to the run's list of notes.",
   "{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\",\"description\":\"The note\"}},"
   "\"required\":[\"text\"],\"additionalProperties\":false}"},
  {"show_state", "Show all counters and notes.",
   "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}"},
};

void exports_airlock_tool_tool_describe(exports_airlock_tool_tool_list_tool_spec_t *ret) {
  size_t n = sizeof SPECS / sizeof SPECS[0];
  ret->ptr = malloc(n * sizeof *ret->ptr);
  if (!ret->ptr) abort();
  ret->len = n;
  for (size_t i = 0; i < n; i++) {
    tool_host_string_dup(&ret->ptr[i].name, SPECS[i][0]);
    tool_host_string_dup(&ret->ptr[i].description, SPECS[i][1]);
    tool_host_string_dup(&ret->ptr[i].parameters, SPECS[i][2]);
  }
}

static bool fail(tool_error_t *err, uint8_t tag, const char *message) {
  err->tag = tag;
  tool_host_string_dup(&err->val.failed, message);
  return false;
}

/* The value of a deps key, parsed; NULL if missing (or null). */
static jval *read_key(airlock_tool_context_borrow_run_context_t ctx, const char *key) {
  tool_host_string_t k, text;
  tool_host_string_set(&k, key);
  if (!airlock_tool_context_method_run_context_get(ctx, &k, &text)) return NULL;
  jval *v = json_parse((const char *)text.ptr, text.len);
  tool_host_string_free(&text);
  return (v && v->type == J_NULL) ? NULL : v;
}

/* Moves compact JSON text of `v` into a WIT string. */
static void put_json(tool_host_string_t *out, const jval *v) {
  size_t len;
  char *text = json_write(v, &len);
  out->ptr = (uint8_t *)text;
  out->len = len;
}

static void add_op(airlock_tool_types_list_context_op_t *ops, uint8_t tag, const char *key, const jval *value) {
  ops->ptr = realloc(ops->ptr, (ops->len + 1) * sizeof *ops->ptr);
  if (!ops->ptr) abort();
  airlock_tool_types_context_op_t *op = &ops->ptr[ops->len++];
  op->tag = tag;
  tool_host_string_dup(&op->val.set.key, key);
  put_json(&op->val.set.value, value);
}

static jval *string_arg(const jval *args, const char *field, tool_error_t *err) {
  jval *v = json_get(args, field, strlen(field));
  if (!v || v->type != J_STR) {
    char message[64];
    strcpy(message, "`");
    strcat(message, field);
    strcat(message, "` must be a string");
    fail(err, AIRLOCK_TOOL_TYPES_TOOL_ERROR_INVALID_ARGS, message);
    return NULL;
  }
  return v;
}

static bool increment(airlock_tool_context_borrow_run_context_t ctx, const jval *args,
                      airlock_tool_types_tool_output_t *ret, tool_error_t *err) {
  jval *name = string_arg(args, "name", err);
  if (!name) return false;
  jval *counters = read_key(ctx, "counters");
  if (!counters) counters = json_new(J_OBJ);
  if (counters->type != J_OBJ) return fail(err, AIRLOCK_TOOL_TYPES_TOOL_ERROR_FAILED, "deps key \"counters\" is not an object");
  jval *current = json_get(counters, name->text, name->len);
  if (current && current->type != J_INT) {
    size_t len;
    char *quoted = json_write(name, &len);
    char *message = malloc(len + 32);
    if (!message) abort();
    strcpy(message, "counter ");
    strcat(message, quoted);
    strcat(message, " is not an integer");
    return fail(err, AIRLOCK_TOOL_TYPES_TOOL_ERROR_FAILED, message);
  }
  jval *value = json_int((current ? current->integer : 0) + 1);
  json_set(counters, name->text, name->len, value);

  jval *result = json_new(J_OBJ);
  json_set(result, "counter", 7, name);
  json_set(result, "value", 5, value);
  put_json(&ret->result, result);
  add_op(&ret->updates, AIRLOCK_TOOL_TYPES_CONTEXT_OP_SET, "counters", counters);
  return true;
}

static bool add_note(airlock_tool_context_borrow_run_context_t ctx, const jval *args,
                     airlock_tool_types_tool_output_t *ret, tool_error_t *err) {
  jval *text = string_arg(args, "text", err);
  if (!text) return false;
  jval *notes = read_key(ctx, "notes");
  long long count = (notes && notes->type == J_ARR) ? (long long)notes->n : 0;
  jval *result = json_new(J_OBJ);
  json_set(result, "added", 5, text);
  json_set(result, "total", 5, json_int(count + 1));
  put_json(&ret->result, result);
  add_op(&ret->updates, AIRLOCK_TOOL_TYPES_CONTEXT_OP_APPEND, "notes", text);
  return true;
}

static bool show_state(airlock_tool_context_borrow_run_context_t ctx, airlock_tool_types_tool_output_t *ret) {
  jval *counters = read_key(ctx, "counters");
  jval *notes = read_key(ctx, "notes");
  jval *result = json_new(J_OBJ);
  json_set(result, "counters", 8, counters ? counters : json_new(J_OBJ));
  json_set(result, "notes", 5, notes ? notes : json_new(J_ARR));
  put_json(&ret->result, result);
  return true;
}

static bool dispatch(airlock_tool_context_borrow_run_context_t ctx, tool_host_string_t *name,
                     exports_airlock_tool_tool_json_t *args_text, airlock_tool_types_tool_output_t *ret,
                     tool_error_t *err) {
  jval *args = json_parse((const char *)args_text->ptr, args_text->len);
  if (!args) return fail(err, AIRLOCK_TOOL_TYPES_TOOL_ERROR_INVALID_ARGS, "arguments are not JSON");
#define IS(tool) (name->len == strlen(tool) && memcmp(name->ptr, tool, name->len) == 0)
  if (IS("increment")) return increment(ctx, args, ret, err);
  if (IS("add_note")) return add_note(ctx, args, ret, err);
  if (IS("show_state")) return show_state(ctx, ret);
#undef IS
    return fail(err, AIRLOCK_TOOL_TYPES_TOOL_ERROR_FAILED, "no such tool");
}

bool exports_airlock_tool_tool_call(exports_airlock_tool_tool_borrow_run_context_t ctx, tool_host_string_t *name,
                                    exports_airlock_tool_tool_json_t *args_text,
                                    exports_airlock_tool_tool_tool_output_t *ret,
                                    exports_airlock_tool_tool_tool_error_t *err) {
  memset(ret, 0, sizeof *ret);
  bool ok = dispatch(ctx, name, args_text, ret, err);
  /* The canonical ABI requires a callee to drop the borrows it was given
   * before returning; the host traps the call otherwise. */
  airlock_tool_context_run_context_drop_borrow(ctx);
  tool_host_string_free(name);
  exports_airlock_tool_tool_json_free(args_text);
  return ok;
}
