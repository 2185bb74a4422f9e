"""What a step leaves: the `Result` (`result`), traces for Perfetto (`trace`) and as text (`trace_text`),
and the structural validation of a trace (`trace_validate`)."""
