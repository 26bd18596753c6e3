/* Stands in for libcudart.so in a test, as a broken CUDA installation behaves on load:
   BT_TEST_CUDART=exit kills the loading process (a driver mismatch aborting), anything
   else never returns (a wedged driver). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void FailToLoad(void) {
  const char* how = getenv("BT_TEST_CUDART");
  if (how != NULL && strcmp(how, "exit") == 0) _exit(1);
  for (;;) pause();
}
