/* A C tool whose one tool, `calls`, counts its calls in a global of the
 * instance and returns the count. Airlock gives every call a fresh
 * instance, prepared ahead of demand or not, so it returns 1 every time
 * (tests/all/isolation.rs checks it). Built like the stateful example,
 * from the same bindings; see the Makefile target `guests-c`. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool_host.h"

/* Survives only as long as the instance does. */
static unsigned long calls;

void exports_airlock_tool_tool_describe(exports_airlock_tool_tool_list_tool_spec_t *ret) {
  ret->ptr = malloc(sizeof *ret->ptr);
  if (!ret->ptr) abort();
  ret->len = 1;
  tool_host_string_dup(&ret->ptr[0].name, "calls");
  tool_host_string_dup(&ret->ptr[0].description,
                       "How many times this instance has been called, this call included.");
  tool_host_string_dup(&ret->ptr[0].parameters,
                       "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}");
}

bool exports_airlock_tool_tool_call(exports_airlock_tool_tool_borrow_run_context_t ctx, tool_host_string_t *name,
                                    exports_airlock_tool_tool_json_t *args_text,
                                    exports_airlock_tool_tool_tool_output_t *ret,
                                    exports_airlock_tool_tool_tool_error_t *err) {
  (void)err;
  memset(ret, 0, sizeof *ret);
  calls += 1;
  char count[24];
  snprintf(count, sizeof count, "%lu", calls);
  tool_host_string_dup(&ret->result, count);
  /* The canonical ABI requires a callee to drop the borrows it was given
   * before returning. */
  airlock_tool_context_run_context_drop_borrow(ctx);
  tool_host_string_free(name);
  exports_airlock_tool_tool_json_free(args_text);
  return true;
}
