"""KWOK's fake GPU nodes and pods on the local control plane, for the scale benchmark."""
