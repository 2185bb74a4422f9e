"""Pipeline schedules as data, beneath both the strategies that run them and the planner that reasons
about them: actions and their check (`actions`), the 1F1B order (`one_f_one_b`), Zero Bubble's heuristic
(`zero_bubble`), a replay of orders with pass times (`timing`), and where receives are posted (`posted`)."""
