"""Quantization: W8A16 / W4A16 / W4A4 through AQT, the asymmetric and GPTQ methods and
their calibration."""
