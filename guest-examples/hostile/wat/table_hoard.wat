;; A tool whose `call` grows four tables to 600,000 funcrefs each: within
;; the per-table element limit, but 19.2 MB of host memory in tables. Tables
;; count against the call's memory limit, so under a 16 MiB limit the third
;; growth is refused (table.grow returns -1) and the tool traps: a
;; `memory_limit` error, deps unchanged.
(component
  (import "airlock:tool/context@0.1.0" (instance $context
    (export "run-context" (type (sub resource)))))
  (alias export $context "run-context" (type $run-context))

  (core module $m
    (memory (export "memory") 1)
    (table $t0 1 funcref)
    (table $t1 1 funcref)
    (table $t2 1 funcref)
    (table $t3 1 funcref)
    (global $next (mut i32) (i32.const 4096))
    ;; A bump allocator, enough for the host to pass the call's strings.
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $ptr i32)
      (local.set $ptr (i32.and
        (i32.add (global.get $next) (i32.sub (local.get 2) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get 2))))
      (global.set $next (i32.add (local.get $ptr) (local.get 3)))
      (local.get $ptr))
    ;; describe: one tool, "hoard", as a list<tool-spec> at 256.
    (data (i32.const 0) "hoard")
    (data (i32.const 16) "Fill four big tables.      ")
    (data (i32.const 48) "{\"type\":\"object\"}")
    (data (i32.const 128) "\00\00\00\00\05\00\00\00\10\00\00\00\1b\00\00\00\30\00\00\00\11\00\00\00")
    (data (i32.const 256) "\80\00\00\00\01\00\00\00")
    (func (export "describe") (result i32) (i32.const 256))
    (func (export "call") (param i32 i32 i32 i32 i32) (result i32)
      (if (i32.eq (table.grow $t0 (ref.null func) (i32.const 600000)) (i32.const -1))
        (then unreachable))
      (if (i32.eq (table.grow $t1 (ref.null func) (i32.const 600000)) (i32.const -1))
        (then unreachable))
      (if (i32.eq (table.grow $t2 (ref.null func) (i32.const 600000)) (i32.const -1))
        (then unreachable))
      (if (i32.eq (table.grow $t3 (ref.null func) (i32.const 600000)) (i32.const -1))
        (then unreachable))
      unreachable))
  (core instance $i (instantiate $m))

  (type $tool-spec (record (field "name" string) (field "description" string) (field "parameters" string)))
  (type $entry (record (field "key" string) (field "value" string)))
  (type $context-op (variant (case "set" $entry) (case "merge" $entry) (case "append" $entry) (case "delete" string)))
  (type $tool-output (record (field "result" string) (field "updates" (list $context-op))))
  (type $tool-error (variant (case "invalid-args" string) (case "failed" string) (case "retry" string)))
  (func $describe (result (list $tool-spec))
    (canon lift (core func $i "describe") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (func $call (param "ctx" (borrow $run-context)) (param "name" string) (param "args" string)
    (result (result $tool-output (error $tool-error)))
    (canon lift (core func $i "call") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (instance $tool
    (export "tool-spec" (type $tool-spec))
    (export "entry" (type $entry))
    (export "context-op" (type $context-op))
    (export "tool-output" (type $tool-output))
    (export "tool-error" (type $tool-error))
    (export "describe" (func $describe))
    (export "call" (func $call)))
  (export "airlock:tool/tool@0.1.0" (instance $tool)))
