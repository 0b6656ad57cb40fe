;; A tool whose every call takes 4 extra linear memories from the host's
;; instance pool (4 instances of a one-memory module) and then spins. Rust
;; cannot declare that shape; WAT can. Called concurrently, it must not take
;; every memory slot: the host admits at most as many of its calls as fit in
;; half the pool, queues the rest (bounded, up to their deadline), and other
;; tools keep being served.
(component
  (import "airlock:tool/context@0.1.0" (instance $context
    (export "run-context" (type (sub resource)))))
  (alias export $context "run-context" (type $run-context))

  (core module $slot (memory 1))
  (core instance (instantiate $slot))
  (core instance (instantiate $slot))
  (core instance (instantiate $slot))
  (core instance (instantiate $slot))

  (core module $m
    (memory (export "memory") 1)
    (global $next (mut i32) (i32.const 4096))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $ptr i32)
      (local.set $ptr (i32.and
        (i32.add (global.get $next) (i32.sub (local.get 2) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get 2))))
      (global.set $next (i32.add (local.get $ptr) (local.get 3)))
      (local.get $ptr))
    ;; describe: one tool, "hog", as a list<tool-spec> at 256.
    (data (i32.const 0) "hog")
    (data (i32.const 16) "Hold pool slots and spin.")
    (data (i32.const 48) "{\"type\":\"object\"}")
    (data (i32.const 128) "\00\00\00\00\03\00\00\00\10\00\00\00\19\00\00\00\30\00\00\00\11\00\00\00")
    (data (i32.const 256) "\80\00\00\00\01\00\00\00")
    (func (export "describe") (result i32) (i32.const 256))
    (func (export "call") (param i32 i32 i32 i32 i32) (result i32)
      (loop $spin (br $spin))
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
