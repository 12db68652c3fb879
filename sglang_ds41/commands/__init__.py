"""Subcommands of `sglang-ds41`; see `sglang_ds41.cli` for the module contract."""
