"""Each exportable family's ONNX graph, one module per family (named by its declaration's `onnx`)."""
