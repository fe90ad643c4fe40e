"""Evaluation: the bench harness, datasets, scoring sandbox, calibration, and the peers (llama.cpp, vLLM)."""
