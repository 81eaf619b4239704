"""edge: the device side of jaxspec (W4A16 drafter, pipelined session state machine, gRPC
client, TUI demo). It imports `jaxspec`, never `verify`. Its contents arrive with the
"W4A16 drafting" and "Edge pipeline" issues."""
