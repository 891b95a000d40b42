"""The engine: data adapting, the Fabric, the loop, checkpoint I/O."""
