"""Benchmarks on vLLM, beside the plugin rather than inside it: `offline` (SwiftKV vs baseline in one
run), `online` (both OpenAI servers under Poisson load) and `profile` (one mixed step under torch's
profiler). `swiftkv bench` is the command line over them."""
