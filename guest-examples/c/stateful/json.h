/* A small JSON library for the C example: parse into a tree that keeps
 * object keys in order, look up and set members, write compact JSON.
 * Integers that fit in a long long are kept as integers; other numbers
 * keep their text. Allocation failure aborts (a trap the host reports). */
#ifndef AIRLOCK_EXAMPLE_JSON_H
#define AIRLOCK_EXAMPLE_JSON_H

#include <stddef.h>

typedef enum { J_NULL, J_BOOL, J_INT, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
  jtype type;
  int boolean;
  long long integer;
  char *text;    /* J_STR: the string (NUL-terminated, may contain NULs); J_NUM: raw text */
  size_t len;    /* J_STR: byte length */
  struct jval **items; /* J_ARR, J_OBJ: values */
  char **keys;         /* J_OBJ: keys (NUL-terminated) */
  size_t *key_lens;
  size_t n, cap;
} jval;

/* Parses `len` bytes; NULL if they are not one JSON value. */
jval *json_parse(const char *text, size_t len);
/* Compact JSON text, malloc'd and NUL-terminated; its length in *out_len. */
char *json_write(const jval *v, size_t *out_len);

jval *json_new(jtype type);
jval *json_string(const char *s, size_t len);
jval *json_int(long long i);
/* The member `key` of object `o`, or NULL. */
jval *json_get(const jval *o, const char *key, size_t key_len);
/* Sets member `key` of object `o`: replaced in place if present, else appended. */
void json_set(jval *o, const char *key, size_t key_len, jval *v);
void json_push(jval *a, jval *v);

#endif
