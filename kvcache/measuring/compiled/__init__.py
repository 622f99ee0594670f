"""The compiled decode: the forward under torch.compile and dynamo's counters, its lifecycle in a session, the
compiled step counted unfused and fused, and fused bytes per kernel."""
