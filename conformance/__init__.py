"""The conformance runner: interface cases and schema fuzzing through the real router."""
