"""MuJoCo tabletop tasks (gymnasium API) and the robot bridge; imports only `capsules`."""
