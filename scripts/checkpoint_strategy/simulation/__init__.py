"""Simulation: Monte Carlo check of a plan (`simulate`) and the storage-vs-safety sweep (`tradeoffs`).

numpy and matplotlib are imported only inside the functions that need them, so importing this
package (or its models) stays cheap.
"""
