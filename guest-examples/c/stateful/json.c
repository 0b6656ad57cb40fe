#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) abort();
  return q;
}

jval *json_new(jtype type) {
  jval *v = xrealloc(NULL, sizeof *v);
  memset(v, 0, sizeof *v);
  v->type = type;
  return v;
}

jval *json_string(const char *s, size_t len) {
  jval *v = json_new(J_STR);
  v->text = xrealloc(NULL, len + 1);
  memcpy(v->text, s, len);
  v->text[len] = 0;
  v->len = len;
  return v;
}

jval *json_int(long long i) {
  jval *v = json_new(J_INT);
  v->integer = i;
  return v;
}

static void grow(jval *v) {
  if (v->n < v->cap) return;
  v->cap = v->cap ? v->cap * 2 : 4;
  v->items = xrealloc(v->items, v->cap * sizeof *v->items);
  if (v->type == J_OBJ) {
    v->keys = xrealloc(v->keys, v->cap * sizeof *v->keys);
    v->key_lens = xrealloc(v->key_lens, v->cap * sizeof *v->key_lens);
  }
}

void json_push(jval *a, jval *v) {
  grow(a);
  a->items[a->n++] = v;
}

jval *json_get(const jval *o, const char *key, size_t key_len) {
  if (!o || o->type != J_OBJ) return NULL;
  for (size_t i = 0; i < o->n; i++)
    if (o->key_lens[i] == key_len && memcmp(o->keys[i], key, key_len) == 0) return o->items[i];
  return NULL;
}

void json_set(jval *o, const char *key, size_t key_len, jval *v) {
  for (size_t i = 0; i < o->n; i++) {
    if (o->key_lens[i] == key_len && memcmp(o->keys[i], key, key_len) == 0) {
      o->items[i] = v;
      return;
    }
  }
  grow(o);
  o->keys[o->n] = xrealloc(NULL, key_len + 1);
  memcpy(o->keys[o->n], key, key_len);
  o->keys[o->n][key_len] = 0;
  o->key_lens[o->n] = key_len;
  o->items[o->n++] = v;
}

/* ---- parsing ---- */

typedef struct {
  const char *p, *end;
} reader;

static void skip_ws(reader *r) {
  while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static int literal(reader *r, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0) return 0;
  r->p += n;
  return 1;
}

static int hex4(reader *r, unsigned *out) {
  if (r->end - r->p < 4) return 0;
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = *r->p++;
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return 0;
  }
  *out = v;
  return 1;
}

typedef struct {
  char *buf;
  size_t len, cap;
} buffer;

static void put(buffer *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    while (b->len + n + 1 > b->cap) b->cap = b->cap ? b->cap * 2 : 64;
    b->buf = xrealloc(b->buf, b->cap);
  }
  memcpy(b->buf + b->len, s, n);
  b->len += n;
  b->buf[b->len] = 0;
}

static void put_utf8(buffer *b, unsigned cp) {
  char out[4];
  size_t n;
  if (cp < 0x80) { out[0] = (char)cp; n = 1; }
  else if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
  else if (cp < 0x10000) { out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[2] = (char)(0x80 | (cp & 0x3F)); n = 3; }
  else { out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F)); out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F)); n = 4; }
  put(b, out, n);
}

/* Reads a string after its opening quote into *b. */
static int read_string(reader *r, buffer *b) {
  put(b, "", 0);
  while (r->p < r->end) {
    char c = *r->p++;
    if (c == '"') return 1;
    if ((unsigned char)c < 0x20) return 0;
    if (c != '\\') { put(b, &c, 1); continue; }
    if (r->p >= r->end) return 0;
    char e = *r->p++;
    switch (e) {
      case '"': put(b, "\"", 1); break;
      case '\\': put(b, "\\", 1); break;
      case '/': put(b, "/", 1); break;
      case 'b': put(b, "\b", 1); break;
      case 'f': put(b, "\f", 1); break;
      case 'n': put(b, "\n", 1); break;
      case 'r': put(b, "\r", 1); break;
      case 't': put(b, "\t", 1); break;
      case 'u': {
        unsigned cp, lo;
        if (!hex4(r, &cp)) return 0;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (!literal(r, "\\u") || !hex4(r, &lo) || lo < 0xDC00 || lo > 0xDFFF) return 0;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          return 0;
        }
        put_utf8(b, cp);
        break;
      }
      default: return 0;
    }
  }
  return 0;
}

static jval *parse_value(reader *r, int depth);

static jval *parse_number(reader *r) {
  const char *start = r->p;
  int is_int = 1;
  if (r->p < r->end && *r->p == '-') r->p++;
  if (r->p >= r->end || *r->p < '0' || *r->p > '9') return NULL;
  if (*r->p == '0') r->p++;
  else while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
  if (r->p < r->end && *r->p == '.') {
    is_int = 0;
    r->p++;
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return NULL;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
  }
  if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
    is_int = 0;
    r->p++;
    if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return NULL;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
  }
  size_t n = (size_t)(r->p - start);
  char *text = xrealloc(NULL, n + 1);
  memcpy(text, start, n);
  text[n] = 0;
    if (is_int) {
    errno = 0;
    long long i = strtoll(text, NULL, 10);
    if (errno != ERANGE) {  /* fits in a long long */
      free(text);
      return json_int(i);
    }
  }
  jval *v = json_new(J_NUM);
  v->text = text;
  return v;
}

static jval *parse_value(reader *r, int depth) {
  if (depth > 128) return NULL;
  skip_ws(r);
  if (r->p >= r->end) return NULL;
  char c = *r->p;
  if (c == 'n') return literal(r, "null") ? json_new(J_NULL) : NULL;
  if (c == 't' || c == 'f') {
    int is_true = c == 't';
    if (!literal(r, is_true ? "true" : "false")) return NULL;
    jval *v = json_new(J_BOOL);
    v->boolean = is_true;
    return v;
  }
  if (c == '"') {
    r->p++;
    buffer b = {0};
    if (!read_string(r, &b)) return NULL;
    jval *v = json_string(b.buf, b.len);
    free(b.buf);
    return v;
  }
  if (c == '[' || c == '{') {
    int is_obj = c == '{';
    jval *v = json_new(is_obj ? J_OBJ : J_ARR);
    r->p++;
    skip_ws(r);
    if (r->p < r->end && *r->p == (is_obj ? '}' : ']')) { r->p++; return v; }
    for (;;) {
      buffer key = {0};
      if (is_obj) {
        skip_ws(r);
        if (r->p >= r->end || *r->p != '"') return NULL;
        r->p++;
        if (!read_string(r, &key)) return NULL;
        skip_ws(r);
        if (r->p >= r->end || *r->p != ':') return NULL;
        r->p++;
      }
      jval *item = parse_value(r, depth + 1);
      if (!item) return NULL;
      if (is_obj) { json_set(v, key.buf, key.len, item); free(key.buf); }
      else json_push(v, item);
      skip_ws(r);
      if (r->p >= r->end) return NULL;
      if (*r->p == ',') { r->p++; continue; }
      if (*r->p == (is_obj ? '}' : ']')) { r->p++; return v; }
      return NULL;
    }
  }
  return parse_number(r);
}

jval *json_parse(const char *text, size_t len) {
  reader r = {text, text + len};
  jval *v = parse_value(&r, 0);
  skip_ws(&r);
  return (v && r.p == r.end) ? v : NULL;
}

/* ---- writing ---- */

static void write_string(buffer *b, const char *s, size_t n) {
  put(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char esc[8];
    switch (c) {
      case '"': put(b, "\\\"", 2); break;
      case '\\': put(b, "\\\\", 2); break;
      case '\n': put(b, "\\n", 2); break;
      case '\r': put(b, "\\r", 2); break;
      case '\t': put(b, "\\t", 2); break;
      case '\b': put(b, "\\b", 2); break;
      case '\f': put(b, "\\f", 2); break;
      default:
        if (c < 0x20) {
          snprintf(esc, sizeof esc, "\\u%04x", c);
          put(b, esc, 6);
        } else {
          put(b, (const char *)&s[i], 1);
        }
    }
  }
  put(b, "\"", 1);
}

static void write_value(buffer *b, const jval *v) {
  char num[32];
  switch (v->type) {
    case J_NULL: put(b, "null", 4); break;
    case J_BOOL: v->boolean ? put(b, "true", 4) : put(b, "false", 5); break;
    case J_INT: put(b, num, (size_t)snprintf(num, sizeof num, "%lld", v->integer)); break;
    case J_NUM: put(b, v->text, strlen(v->text)); break;
    case J_STR: write_string(b, v->text, v->len); break;
    case J_ARR:
    case J_OBJ:
      put(b, v->type == J_OBJ ? "{" : "[", 1);
      for (size_t i = 0; i < v->n; i++) {
        if (i) put(b, ",", 1);
        if (v->type == J_OBJ) {
          write_string(b, v->keys[i], v->key_lens[i]);
          put(b, ":", 1);
        }
        write_value(b, v->items[i]);
      }
      put(b, v->type == J_OBJ ? "}" : "]", 1);
      break;
  }
}

char *json_write(const jval *v, size_t *out_len) {
  buffer b = {0};
  write_value(&b, v);
  if (out_len) *out_len = b.len;
  return b.buf;
}
