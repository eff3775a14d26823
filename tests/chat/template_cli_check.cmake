# ctest lm_template_prompt: `kiln-lm template` on a tokenizer directory prints
# expected_prompt.txt byte for byte (no newline added), and a bad request fails
# with a message.
#   cmake -DLM=kiln-lm -DDIR=tests/chat/fixtures/qwen3 -P template_cli_check.cmake
execute_process(
  COMMAND ${LM} template --tokenizer ${DIR} --messages ${DIR}/request.json --add-generation-prompt
  OUTPUT_VARIABLE got RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kiln-lm template failed (${rc}): ${err}")
endif()
file(READ ${DIR}/expected_prompt.txt want)
if(NOT got STREQUAL want)
  message(FATAL_ERROR "kiln-lm template printed:\n[${got}]\nexpected:\n[${want}]")
endif()
execute_process(
  COMMAND ${LM} template --tokenizer ${DIR} --messages ${DIR}/tokenizer_config.json
  OUTPUT_VARIABLE got RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "needs \"messages\"")
  message(FATAL_ERROR "a request without messages: rc ${rc}, stderr: ${err}")
endif()
