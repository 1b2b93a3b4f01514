"""Exported runtimes: a candidate compiled to ONNX (graph, onnx_file), answered by ONNX Runtime
(runtime, scorer), built and compared with its source by export@m (build)."""
