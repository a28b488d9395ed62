"""The modelpool reconciler: renders and applies what the three CRDs ask for, and runs
each ModelPool's swap state machine."""
