"""verify: the cloud side of jaxspec (KV slot pool, multi-tenant verify step, scheduler,
gRPC service). It imports `jaxspec`, never `edge`. Its contents arrive with the
"Multi-tenant verifier" and "gRPC verifier service" issues."""
