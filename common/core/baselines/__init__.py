"""Sans-I/O cores of the schedulers Megha is compared with (PigeonC, Sparrow); they report to the same
`CoreObserver` as Megha's GM and LM, so every scheduler is measured the same way."""
