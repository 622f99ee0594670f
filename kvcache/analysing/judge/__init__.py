"""The judge: the measure table, the rules, each measure's judge, the gate that applies them, baseline entries and
files, and the A/B paired judge. Standard library only."""
