"""Detection: findings from the store, folded into incidents."""
